package pybridge_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The test binary doubles as the rank program: with PB_TEST_ROLE set it runs
// that role as one rank (the launcher environment tells it which) instead of
// the tests, so multi-process tests need nothing but this binary.
var roles = map[string]func() error{
	"collectives": roleCollectives,
	"async":       roleAsync,
	"worktest":    roleWorkTest,
	"goroutines":  roleGoroutines,
	"errors":      roleErrors,
	"nojoin":      roleNoJoin,
	"peerdies":    rolePeerDies,
	"signals":     roleSignals,
}

func TestMain(m *testing.M) {
	if role := os.Getenv("PB_TEST_ROLE"); role != "" {
		os.Exit(runRole(role))
	}
	os.Exit(m.Run())
}

func runRole(name string) int {
	fn, ok := roles[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown PB_TEST_ROLE %q\n", name)
		return 2
	}
	if err := fn(); err != nil {
		fmt.Printf("rank %s: FAIL %s: %v\n", os.Getenv("RANK"), name, err)
		return 1
	}
	fmt.Printf("rank %s: PASS %s\n", os.Getenv("RANK"), name)
	return 0
}

// logf prints a rank-prefixed line; the parent shows it when a test fails.
func logf(format string, args ...any) {
	fmt.Printf("rank %s: %s\n", os.Getenv("RANK"), fmt.Sprintf(format, args...))
}

// freePort picks a rendezvous port as pybridge.base.netif.free_port does: from
// PYBRIDGE_PORTS (make test gives Go's tests their own range), else 20000-31999,
// below Linux's ephemeral range (32768-60999): a port found free there can be taken,
// before rank 0 binds it, as the source port of any outgoing connection (seen in CI).
func freePort(t testing.TB) int {
	t.Helper()
	port, err := belowEphemeral()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func belowEphemeral() (int, error) {
	low, high := 20000, 31999
	if spec := os.Getenv("PYBRIDGE_PORTS"); spec != "" {
		if _, err := fmt.Sscanf(spec, "%d-%d", &low, &high); err != nil || low > high {
			return 0, fmt.Errorf("PYBRIDGE_PORTS=%q: expected LOW-HIGH", spec)
		}
	}
	for range 200 {
		port := low + rand.IntN(high-low+1)
		if l, err := net.Listen("tcp", ":"+strconv.Itoa(port)); err == nil {
			l.Close()
			return port, nil
		}
	}
	return 0, fmt.Errorf("no free port in %d-%d", low, high)
}

// lockedBuffer lets a test read a rank's output while it is still running.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type rankProc struct {
	rank int
	out  *lockedBuffer
	err  error // from Wait: nil for exit status 0
}

type launch struct {
	role  string
	world int
	only  []int         // ranks to start; nil starts all (the others never join)
	limit time.Duration // every rank is killed after this
	env   []string
	argv  func(rank int) []string // a rank's own program and arguments; nil runs this binary
}

// rankEnv is the environment a launcher such as torchrun gives rank r.
func rankEnv(role string, r, world, port int, extra []string) []string {
	env := append(os.Environ(),
		"PB_TEST_ROLE="+role,
		"RANK="+strconv.Itoa(r),
		"WORLD_SIZE="+strconv.Itoa(world),
		"LOCAL_RANK="+strconv.Itoa(r),
		"MASTER_ADDR=127.0.0.1",
		"MASTER_PORT="+strconv.Itoa(port))
	return append(env, extra...)
}

// runRanks starts the role's ranks on a fresh port and waits for all of them,
// killing every rank when l.limit passes.
func runRanks(t *testing.T, l *launch) []*rankProc {
	t.Helper()
	ranks := l.only
	if ranks == nil {
		for r := range l.world {
			ranks = append(ranks, r)
		}
	}
	port := freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), l.limit)
	defer cancel()
	procs := make([]*rankProc, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		p := &rankProc{rank: r, out: &lockedBuffer{}}
		procs[i] = p
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		if l.argv != nil {
			if argv := l.argv(r); argv != nil {
				cmd = exec.CommandContext(ctx, argv[0], argv[1:]...)
			}
		}
		cmd.Env = rankEnv(l.role, r, l.world, port, l.env)
		cmd.Stdout, cmd.Stderr = p.out, p.out
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			t.Fatalf("start rank %d: %v", r, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.err = cmd.Wait()
		}()
	}
	wg.Wait()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("role %s: ranks still running after %v, killed\n%s", l.role, l.limit, dump(procs))
	}
	return procs
}

func dump(procs []*rankProc) string {
	var sb strings.Builder
	for _, p := range procs {
		status := "exit 0"
		if p.err != nil {
			status = p.err.Error()
		}
		fmt.Fprintf(&sb, "----- rank %d (%s) -----\n%s", p.rank, status, p.out.String())
	}
	return sb.String()
}

// expectPass fails the test unless every rank exited 0.
func expectPass(t *testing.T, procs []*rankProc) {
	t.Helper()
	for _, p := range procs {
		if p.err != nil {
			t.Fatalf("rank %d failed: %v\n%s", p.rank, p.err, dump(procs))
		}
	}
	t.Logf("\n%s", dump(procs))
}
