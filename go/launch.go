package pybridge

/*
#include "pbgo.h"
*/
import "C"

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// LaunchEnv describes this process as its launcher started it: pybridge-launch or
// torchrun, or srun or mpirun with no variables exported (SLURM, Open MPI, PMI).
// Init reads the same, by the same rule; LaunchEnv is for a program that wants
// them itself, e.g. to pick its device or name its log files before joining the group.
type LaunchEnv struct {
	Rank, LocalRank, WorldSize int
	// LocalWorldSize is the number of ranks on this node (the launcher's
	// LOCAL_WORLD_SIZE, srun's or mpirun's count), or the world size when nothing says.
	LocalWorldSize int
	MasterAddr     string // "" when nothing says (Init then needs MASTER_ADDR)
	MasterPort     int    // 0 when nothing says
	// Device is this rank's CUDA device index, or CPU (-1): pybridge-launch sets
	// PYBRIDGE_DEVICE to "cuda:N" on GPU machines and "cpu" otherwise.
	Device int
	// RestartCount is how many times the launcher has restarted the job (0 at first).
	RestartCount int
}

// FromLaunchEnv reads where this process sits in its job by the rule Init follows
// (the core's, pb_job_env): the launcher's RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, else the variables of SLURM (srun), Open MPI (mpirun) or PMI
// (MPICH, Intel MPI); the rendezvous from MASTER_ADDR and MASTER_PORT, else as srun
// and mpirun imply it. LocalRank is the rank when nothing says. Device and
// RestartCount are pybridge-launch's and torchrun's own variables (PYBRIDGE_DEVICE,
// TORCHELASTIC_RESTART_COUNT). As for Init, the library reads the environment the
// process had when the library started (its first call). It fails with
// ErrInvalidArgument, naming the variables, when rank and world size are unknown, a
// variable is malformed, or a launcher's and a scheduler's variables disagree.
func FromLaunchEnv() (LaunchEnv, error) {
	const op = "FromLaunchEnv"
	var rank, size, local, localSize, port C.int32_t
	addr := make([]C.char, 1024)
	var msg *C.char
	if err := check(op, C.pbgo_job_env(&rank, &size, &local, &localSize, &addr[0], C.int32_t(len(addr)), &port,
		&msg), msg); err != nil {
		return LaunchEnv{}, err
	}
	e := LaunchEnv{Rank: int(rank), WorldSize: int(size), LocalRank: int(local), LocalWorldSize: int(localSize),
		MasterAddr: C.GoString(&addr[0]), MasterPort: int(port)}
	if e.LocalWorldSize < 0 {
		e.LocalWorldSize = e.WorldSize
	}
	if e.MasterPort < 0 {
		e.MasterPort = 0
	}
	var err error
	if e.Device, err = parseDevice(os.Getenv("PYBRIDGE_DEVICE")); err != nil {
		return LaunchEnv{}, newError(statusInvalidArgument, op, "%v", err)
	}
	if raw := os.Getenv("TORCHELASTIC_RESTART_COUNT"); raw != "" {
		if e.RestartCount, err = strconv.Atoi(raw); err != nil || e.RestartCount < 0 {
			return LaunchEnv{}, newError(statusInvalidArgument, op,
				"TORCHELASTIC_RESTART_COUNT=%q is not a non-negative integer", raw)
		}
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
