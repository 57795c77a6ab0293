package pybridge_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
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
		os.Exit(runRoles(role, os.Getenv("PB_TEST_PORTS")))
	}
	os.Exit(m.Run())
}

// runRoles runs one role, or a shared world's roles in turn ("a,b,c", each on its own
// rendezvous port from ports), and stops at the first that fails.
func runRoles(list, ports string) int {
	names := strings.Split(list, ",")
	if len(names) == 1 {
		return runRole(list)
	}
	each := strings.Split(ports, ",")
	if len(each) != len(names) {
		fmt.Fprintf(os.Stderr, "PB_TEST_PORTS=%q: want one port for each of %d roles\n", ports, len(names))
		return 2
	}
	for i, name := range names {
		roleInitMethod = "tcp://127.0.0.1:" + each[i]
		if code := runRole(name); code != 0 {
			return code
		}
	}
	return 0
}

// roleInitMethod is where the running role of a shared world meets its peers.
var roleInitMethod string

// initRole is pybridge.Init for a role that may run in a shared world: there each role
// has its own port, so a role never meets the store of the one before it, still closing.
func initRole(opts ...pybridge.Option) (*pybridge.Group, error) {
	if roleInitMethod != "" {
		opts = append([]pybridge.Option{pybridge.WithInitMethod(roleInitMethod)}, opts...)
	}
	return pybridge.Init(opts...)
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
	// stopOnFailure kills every rank as soon as one fails
	stopOnFailure bool
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
	procs, err := startRanks(l)
	if err != nil {
		t.Fatal(err)
	}
	return procs
}

func startRanks(l *launch) ([]*rankProc, error) {
	ranks := l.only
	if ranks == nil {
		for r := range l.world {
			ranks = append(ranks, r)
		}
	}
	port, err := belowEphemeral()
	if err != nil {
		return nil, err
	}
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
			cancel()
			wg.Wait()
			return nil, fmt.Errorf("start rank %d: %v", r, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.err = cmd.Wait()
			if p.err != nil && l.stopOnFailure {
				cancel()
			}
		}()
	}
	wg.Wait()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return procs, fmt.Errorf("role %s: ranks still running after %v, killed\n%s", l.role, l.limit, dump(procs))
	}
	return procs, nil
}

// A shared world: the tests whose role passes on a healthy world of one size share its
// rank processes. Starting a rank costs about 1.4 s of CPU (its embedded Python imports
// torch), most of what such a test costs; 14 roles on 2 and 4 ranks took 36 rank starts
// apart and take 6 together. Every rank runs the roles in turn, each with its own Init
// (on its own port) and Close, as a program may; a rank stops at its first failing role
// and the world's other ranks are stopped with it. Each test reads its role's PASS line
// from every rank, so a failure is still reported by the test of the role that failed.
type sharedWorld struct {
	world int
	limit time.Duration
	roles []sharedRole // in the order every rank runs them (share)
	once  sync.Once
	procs []*rankProc
	err   error
	ran   []string // the roles run, in order
	ports []string // each one's rendezvous port
}

type sharedRole struct{ role, test string }

var (
	world2 = &sharedWorld{world: 2, limit: 240 * time.Second}
	world4 = &sharedWorld{world: 4, limit: 300 * time.Second}
)

// share adds role, whose pass the test named test reads (expectRolePass), to w's roles:
// the file that defines a role shares it in its func init, beside roles[role], so no
// list elsewhere names it. Every rank runs them in the order they were shared (Go runs
// the files' init functions in file name order).
func (w *sharedWorld) share(role, test string) {
	w.roles = append(w.roles, sharedRole{role, test})
}

// expectRolePass runs the shared world once (the roles whose tests this run selects) and
// fails t unless role passed on every rank.
func expectRolePass(t *testing.T, w *sharedWorld, role string) {
	t.Helper()
	w.once.Do(w.run)
	if !slices.Contains(w.ran, role) {
		t.Fatalf("role %s is not among the roles this %d-rank world ran (%v): does its file share it "+
			"(world.share(%q, %q) in its func init)?", role, w.world, w.ran, role, t.Name())
	}
	if w.err != nil {
		t.Fatalf("the shared %d-rank world (%s): %v", w.world, strings.Join(w.ran, ", "), w.err)
	}
	var order []string
	for i, r := range w.ran {
		order = append(order, fmt.Sprintf("%s on port %s", r, w.ports[i]))
	}
	for _, p := range w.procs {
		if strings.Contains(p.out.String(), fmt.Sprintf("rank %d: FAIL %s:", p.rank, role)) {
			t.Fatalf("role %s failed on rank %d of the shared %d-rank world (roles in order: %s)\n%s",
				role, p.rank, w.world, strings.Join(order, ", "), dump(w.procs))
		}
	}
	for _, p := range w.procs {
		if !strings.Contains(p.out.String(), fmt.Sprintf("rank %d: PASS %s\n", p.rank, role)) {
			t.Fatalf("role %s did not finish on rank %d of the shared %d-rank world (roles in order: %s): "+
				"the world stopped at %s\n%s", role, p.rank, w.world, strings.Join(order, ", "), w.firstFailure(), dump(w.procs))
		}
	}
	t.Logf("\n%s", dump(w.procs))
}

// firstFailure names the failure that stopped a shared world, as its ranks reported it.
func (w *sharedWorld) firstFailure() string {
	for _, p := range w.procs {
		for _, line := range strings.Split(p.out.String(), "\n") {
			if strings.HasPrefix(line, fmt.Sprintf("rank %d: FAIL ", p.rank)) {
				return strconv.Quote(line)
			}
		}
	}
	for _, p := range w.procs {
		if p.err != nil {
			return fmt.Sprintf("rank %d's exit (%v)", p.rank, p.err)
		}
	}
	return "no failure reported"
}

func (w *sharedWorld) run() {
	taken := map[int]bool{}
	for _, r := range w.roles {
		if !selected(r.test) {
			continue
		}
		// Each role a port of its own: drawn twice, a port would bring a role to the store
		// of the one before it, still closing, and its stale addresses (a CI flake:
		// "Gloo connectFullMesh failed ... Connection refused").
		port, err := belowEphemeral()
		for err == nil && taken[port] {
			port, err = belowEphemeral()
		}
		if err != nil {
			w.err = err
			return
		}
		taken[port] = true
		w.ran = append(w.ran, r.role)
		w.ports = append(w.ports, strconv.Itoa(port))
	}
	w.procs, w.err = startRanks(&launch{role: strings.Join(w.ran, ","), world: w.world, limit: w.limit,
		env: []string{"PB_TEST_PORTS=" + strings.Join(w.ports, ",")}, stopOnFailure: true})
}

// selected says whether this run's -test.run and -test.skip select the top-level test name.
func selected(name string) bool {
	matches := func(flagName string) (match, set bool) {
		f := flag.Lookup(flagName)
		if f == nil || f.Value.String() == "" {
			return false, false
		}
		ok, err := regexp.MatchString(strings.Split(f.Value.String(), "/")[0], name)
		return err == nil && ok, true
	}
	if m, set := matches("test.run"); set && !m {
		return false
	}
	m, set := matches("test.skip")
	return !(set && m)
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
