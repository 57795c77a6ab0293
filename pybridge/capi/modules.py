"""C ABI function that imports a Python module into the library's interpreter: one that
registers comm hooks or server strategies, for C and Go to choose by name
(capi/pybridge.h, "Python modules"). Conversion only: the registries are the core's."""

import importlib

from ..errors import InvalidArgument
from . import text


def pb_import_module(name):
    module = text(name)
    if not module:
        raise InvalidArgument(f"name is {'NULL' if module is None else 'empty'}: give a module's name")
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module != exc.name and not module.startswith(exc.name + "."):
            raise InvalidArgument(f"importing {module!r}: {exc}") from exc  # a module it imports is missing
        raise InvalidArgument(f"no module named {module!r} on the library's sys.path "
                              "(PYBRIDGE_PYTHONPATH puts folders first)") from exc
    except Exception as exc:
        raise InvalidArgument(f"importing {module!r} raised {type(exc).__name__}: {exc}") from exc
