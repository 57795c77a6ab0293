package pybridge

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// LaunchEnv describes this process as pybridge-launch (or torchrun) started it.
// Init reads the same variables; LaunchEnv is for a program that wants them itself,
// e.g. to pick its device or name its log files before joining the group.
type LaunchEnv struct {
	Rank, LocalRank, WorldSize, LocalWorldSize int
	MasterAddr                                 string
	MasterPort                                 int
	// Device is this rank's CUDA device index, or CPU (-1): pybridge-launch sets
	// PYBRIDGE_DEVICE to "cuda:N" on GPU machines and "cpu" otherwise.
	Device int
	// RestartCount is how many times the launcher has restarted the job (0 at first).
	RestartCount int
}

// FromLaunchEnv reads the launcher's environment. It fails with ErrInvalidArgument,
// naming the variable, when one is missing or malformed.
func FromLaunchEnv() (LaunchEnv, error) {
	const op = "FromLaunchEnv"
	var e LaunchEnv
	var err error
	num := func(name string, required bool, def int) int {
		if err != nil {
			return 0
		}
		raw, ok := os.LookupEnv(name)
		if !ok || raw == "" {
			if required {
				err = newError(statusInvalidArgument, op, "%s is not set: start this program with pybridge-launch or torchrun", name)
			}
			return def
		}
		v, convErr := strconv.Atoi(raw)
		if convErr != nil || v < 0 {
			err = newError(statusInvalidArgument, op, "%s=%q is not a non-negative integer", name, raw)
		}
		return v
	}
	e.Rank = num("RANK", true, 0)
	e.WorldSize = num("WORLD_SIZE", true, 0)
	e.LocalRank = num("LOCAL_RANK", false, e.Rank)
	e.LocalWorldSize = num("LOCAL_WORLD_SIZE", false, e.WorldSize)
	e.MasterPort = num("MASTER_PORT", false, 0)
	e.RestartCount = num("TORCHELASTIC_RESTART_COUNT", false, 0)
	if err != nil {
		return LaunchEnv{}, err
	}
	e.MasterAddr = os.Getenv("MASTER_ADDR")
	if e.Device, err = parseDevice(os.Getenv("PYBRIDGE_DEVICE")); err != nil {
		return LaunchEnv{}, newError(statusInvalidArgument, op, "%v", err)
	}
	return e, nil
}

// parseDevice reads "cpu", "cuda" (device 0) or "cuda:N"; empty means CPU.
func parseDevice(s string) (int, error) {
	switch {
	case s == "" || s == "cpu":
		return CPU, nil
	case s == "cuda":
		return 0, nil
	case strings.HasPrefix(s, "cuda:"):
		if n, err := strconv.Atoi(s[len("cuda:"):]); err == nil && n >= 0 {
			return n, nil
		}
	}
	return 0, fmt.Errorf("PYBRIDGE_DEVICE=%q is not cpu, cuda or cuda:N", s)
}
