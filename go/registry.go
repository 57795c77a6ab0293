package pybridge

/*
#include "pbgo.h"
*/
import "C"

import "unsafe"

// Hooks and server strategies by name: a Python module registers them
// (pybridge.register_comm_hook, pybridge.federated.register_strategy), the
// program imports that module into the library's interpreter with ImportModule,
// then chooses them by name, as it chooses the built-ins (docs/comm-hooks.md
// "Registering a hook", docs/federated.md "Registering a strategy").

// ImportModule imports the Python module name (a dotted name for a submodule)
// into the library's interpreter, once: a module that registers comm hooks or
// server strategies for WithHookName and WithServerOptimizerName. It is looked up
// on the interpreter's sys.path (the PYBRIDGE_PYTHONPATH environment variable
// puts folders first). Every process that chooses a registered name imports its
// module first; Init is not needed. A module that is missing or raises while
// importing is ErrInvalidArgument, with Python's error in the message.
func ImportModule(name string) error {
	const op = "ImportModule"
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var msg *C.char
	return check(op, C.pbgo_import_module(cname, &msg), msg)
}

// WithHookName chooses the communication hook registered as name: a built-in's
// name (its Hook constant's C name in lower case, "fp16" for HookFP16, taking
// the settings of WithPowerSGD and WithHierarchical's options) or one a module
// registered (ImportModule), which takes no settings. An unknown name makes
// NewReducer fail with ErrInvalidArgument listing every name. As the other hook
// options, the last one given wins.
func WithHookName(name string) ReducerOption {
	return func(c *reducerConfig) {
		c.setHook(HookAllReduce)
		c.hookName = &name
	}
}

// WithServerOptimizerName chooses the server strategy registered as name, a
// built-in's ("fedavg", "fedadam", ...: its FedStrategy constant's C name in
// lower case) or one a module registered (ImportModule), at server learning
// rate eta (0: the strategy's default). The options that set settings
// (WithServerMomentum, WithAdaptiveMoments) apply to a strategy that takes
// them. An unknown name makes NewFedServer fail with ErrInvalidArgument listing
// every name.
func WithServerOptimizerName(name string, eta float64) FedOption {
	return func(c *fedConfig) {
		o := c.options()
		o.strategy, o.eta = C.PB_FED_STRATEGY_FEDAVG, C.double(eta)
		c.strategyName = &name
	}
}
