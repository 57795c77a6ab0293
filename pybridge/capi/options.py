"""Size-prefixed option structs (pb_reducer_options, pb_fed_options): read the fields the
caller's `size` covers; the others take their defaults (docs/design.md, "The C ABI")."""

from .. import capi
from ..errors import InvalidArgument

MAX_SIZE = 1 << 16  # far past any future struct: a larger size is garbage, not a version


def read(ptr, ctype, defaults):
    """The fields of the `ctype` struct at ptr (NULL: `defaults`), honouring its size."""
    ffi = capi.ffi
    got = dict(defaults)
    if ptr == ffi.NULL:
        return got
    init = ctype.replace("_options", "_options_init")
    size, known = int(ptr.size), ffi.sizeof(ctype)
    if size < 4 or size > MAX_SIZE:
        raise InvalidArgument(f"{ctype}.size is {size}; set it with {init} "
                              f"(sizeof({ctype}) is {known} in this library)")
    for name, field in ffi.typeof(ctype).fields:
        if name == "size":
            continue
        start, end = field.offset, field.offset + ffi.sizeof(field.type)
        if end <= size:
            got[name] = getattr(ptr, name)
        elif start < size:
            raise InvalidArgument(f"{ctype}.size {size} ends inside field {name} (bytes {start}..{end}); "
                                  f"set it with {init}")
    if size > known and any(ffi.buffer(ffi.cast("char *", ptr) + known, size - known)[:]):
        raise InvalidArgument(f"{ctype}.size is {size} but this library knows {known} bytes, and "
                              "bytes past them are set (options of a newer pybridge?)")
    return got


def name(value, what):
    """A `const char *` field naming something (a hook, a strategy): None when NULL."""
    if value is None or value == capi.ffi.NULL:
        return None
    try:
        return capi.ffi.string(value).decode()
    except UnicodeDecodeError:
        raise InvalidArgument(f"{what} is not UTF-8 text") from None
