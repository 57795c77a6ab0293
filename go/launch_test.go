package pybridge

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The library reads the environment once, when it starts (as Init does): each case of
// FromLaunchEnv runs in a process of its own, this test binary again with
// PB_LAUNCHENV_CHILD set, which prints what FromLaunchEnv returned.
func TestFromLaunchEnvChild(t *testing.T) {
	if os.Getenv("PB_LAUNCHENV_CHILD") == "" {
		t.Skip("run by TestFromLaunchEnv in a process of its own")
	}
	e, err := FromLaunchEnv()
	if err != nil {
		fmt.Printf("ERR %v\n", err)
		if !errors.Is(err, ErrInvalidArgument) {
			fmt.Printf("NOT ErrInvalidArgument\n")
		}
		return
	}
	out, _ := json.Marshal(e)
	fmt.Printf("ENV %s\n", out)
}

// launchEnvIn runs FromLaunchEnv in a child whose environment is the parent's without
// any launcher's or scheduler's variables, plus vars; it returns the child's line.
func launchEnvIn(t *testing.T, vars ...string) string {
	t.Helper()
	env := []string{"PB_LAUNCHENV_CHILD=1"}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case name == "RANK", name == "WORLD_SIZE", name == "PYBRIDGE_DEVICE", strings.HasPrefix(name, "LOCAL_"),
			strings.HasPrefix(name, "MASTER_"), strings.HasPrefix(name, "SLURM_"), strings.HasPrefix(name, "OMPI_"),
			strings.HasPrefix(name, "PMI"), strings.HasPrefix(name, "MPI_"), strings.HasPrefix(name, "TORCHELASTIC_"),
			name == "GROUP_RANK", name == "PB_TEST_ROLE":
			continue
		}
		env = append(env, kv)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFromLaunchEnvChild$", "-test.v")
	cmd.Env = append(env, vars...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "ENV ") || strings.HasPrefix(line, "ERR ") {
			if strings.Contains(string(out), "NOT ErrInvalidArgument") {
				t.Fatalf("the error is not ErrInvalidArgument: %s", out)
			}
			return line
		}
	}
	t.Fatalf("child printed no result:\n%s", out)
	return ""
}

func TestFromLaunchEnv(t *testing.T) {
	want := func(e LaunchEnv) string {
		out, _ := json.Marshal(e)
		return "ENV " + string(out)
	}
	cases := []struct {
		name string
		vars []string
		want string
	}{
		{"launcher", []string{"RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2",
			"MASTER_ADDR=10.0.0.7", "MASTER_PORT=29500", "PYBRIDGE_DEVICE=cuda:1", "TORCHELASTIC_RESTART_COUNT=2"},
			want(LaunchEnv{Rank: 3, LocalRank: 1, WorldSize: 4, LocalWorldSize: 2, MasterAddr: "10.0.0.7",
				MasterPort: 29500, Device: 1, RestartCount: 2})},
		// mpirun exports nothing of the launcher's: Open MPI's own variables, one node.
		{"mpirun", []string{"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_RANK=1",
			"OMPI_COMM_WORLD_LOCAL_SIZE=2", "MASTER_PORT=29501", "PYBRIDGE_DEVICE=cpu"},
			want(LaunchEnv{Rank: 1, LocalRank: 1, WorldSize: 2, LocalWorldSize: 2, MasterAddr: "127.0.0.1",
				MasterPort: 29501, Device: CPU})},
		// srun: SLURM's, the master the step's first node.
		{"srun", []string{"SLURM_PROCID=2", "SLURM_STEP_NUM_TASKS=4", "SLURM_LOCALID=0", "SLURM_GTIDS=2,3",
			"SLURM_STEP_NODELIST=node[07-08]", "SLURM_JOB_ID=77", "SLURM_STEP_ID=0", "MASTER_PORT=29502"},
			want(LaunchEnv{Rank: 2, LocalRank: 0, WorldSize: 4, LocalWorldSize: 2, MasterAddr: "node07",
				MasterPort: 29502, Device: CPU})},
		{"nothing", nil, "ERR pybridge: FromLaunchEnv: rank and world size are unknown"},
		{"malformed", []string{"RANK=0", "WORLD_SIZE=two"}, "WORLD_SIZE='two' is not an integer"},
		{"disagree", []string{"RANK=1", "WORLD_SIZE=2", "SLURM_PROCID=0", "SLURM_STEP_NUM_TASKS=2"},
			"RANK=1 but SLURM_PROCID=0"},
		{"device", []string{"RANK=0", "WORLD_SIZE=1", "PYBRIDGE_DEVICE=gpu7"}, `PYBRIDGE_DEVICE="gpu7"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := launchEnvIn(t, c.vars...)
			if strings.HasPrefix(c.want, "ENV ") && got != c.want || !strings.Contains(got, c.want) {
				t.Fatalf("got %s\nwant %s", got, c.want)
			}
		})
	}
}
