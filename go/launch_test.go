package pybridge

import (
	"errors"
	"strings"
	"testing"
)

func TestFromLaunchEnv(t *testing.T) {
	t.Setenv("RANK", "3")
	t.Setenv("WORLD_SIZE", "4")
	t.Setenv("LOCAL_RANK", "1")
	t.Setenv("LOCAL_WORLD_SIZE", "2")
	t.Setenv("MASTER_ADDR", "10.0.0.7")
	t.Setenv("MASTER_PORT", "29500")
	t.Setenv("PYBRIDGE_DEVICE", "cuda:1")
	t.Setenv("TORCHELASTIC_RESTART_COUNT", "2")
	e, err := FromLaunchEnv()
	if err != nil {
		t.Fatal(err)
	}
	want := LaunchEnv{Rank: 3, LocalRank: 1, WorldSize: 4, LocalWorldSize: 2, MasterAddr: "10.0.0.7",
		MasterPort: 29500, Device: 1, RestartCount: 2}
	if e != want {
		t.Fatalf("got %+v, want %+v", e, want)
	}
	t.Setenv("PYBRIDGE_DEVICE", "cpu")
	if e, _ := FromLaunchEnv(); e.Device != CPU {
		t.Fatalf("cpu device read as %d", e.Device)
	}
}

func TestFromLaunchEnvNamesWhatIsWrong(t *testing.T) {
	for _, c := range []struct{ name, value, words string }{
		{"RANK", "", "RANK is not set"},
		{"WORLD_SIZE", "two", `WORLD_SIZE="two"`},
		{"PYBRIDGE_DEVICE", "gpu7", `PYBRIDGE_DEVICE="gpu7"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("RANK", "0")
			t.Setenv("WORLD_SIZE", "1")
			t.Setenv("PYBRIDGE_DEVICE", "")
			t.Setenv(c.name, c.value)
			_, err := FromLaunchEnv()
			if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), c.words) {
				t.Fatalf("got %v, want ErrInvalidArgument mentioning %s", err, c.words)
			}
		})
	}
}
