// The harness: real leasehold and real etcd 3.7 processes on loopback, one scenario run against
// both, and their transcripts compared line by line.
//
// LEASEHOLD_BIN names the leasehold binary and ETCD37_BIN the etcd 3.7 binary; scripts/test.sh
// sets both (it builds etcd 3.7 from the Go module proxy, see go/tools/etcd). A missing binary
// fails the test: nothing here is skipped.
//
// Ports come from the same pool as the Rust test kit's (crates/testkit/src/ports.rs): below the
// kernel's ephemeral range, each one locked with flock on <tmp>/leasehold-test-ports/<port>.lock
// for as long as this process lives, so Go and Rust tests running at once never share a port.
package clientv3diff

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

const (
	readyTimeout   = 30 * time.Second
	requestTimeout = 10 * time.Second
)

// target is one kind of server a scenario runs against.
type target struct {
	name string // "leasehold" or "etcd-3.7"
	bin  string
}

func targets(t testing.TB) []target {
	t.Helper()
	var out []target
	for _, v := range []struct{ name, env string }{{"leasehold", "LEASEHOLD_BIN"}, {"etcd-3.7", "ETCD37_BIN"}} {
		bin := os.Getenv(v.env)
		if bin == "" {
			t.Fatalf("%s is not set: run this through scripts/test.sh, or set it to the %s binary", v.env, v.name)
		}
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("%s=%s: %v", v.env, bin, err)
		}
		out = append(out, target{v.name, bin})
	}
	return out
}

var (
	portsMu   sync.Mutex
	portsHeld = map[int]*os.File{}
)

// freePorts reserves n loopback ports for this process (see the file comment).
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	high := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				high = v
			}
		}
	}
	const low = 10000
	lockDir := filepath.Join(os.TempDir(), "leasehold-test-ports")
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		t.Fatal(err)
	}
	portsMu.Lock()
	defer portsMu.Unlock()
	span := high - low
	start := rand.IntN(span)
	var out []int
	for step := 0; step < span && len(out) < n; step++ {
		port := low + (start+step)%span
		if _, held := portsHeld[port]; held {
			continue
		}
		f, err := os.OpenFile(filepath.Join(lockDir, fmt.Sprintf("%d.lock", port)), os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			f.Close()
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			f.Close()
			continue
		}
		l.Close()
		portsHeld[port] = f
		out = append(out, port)
	}
	if len(out) != n {
		t.Fatalf("no %d free test ports in %d..%d", n, low, high)
	}
	return out
}

// member is one running server process.
type member struct {
	name   string
	client string // http://127.0.0.1:port
	cmd    *exec.Cmd
	log    string
	done   chan struct{}
	bin    string
	args   []string // to start it again on the same data dir
}

func (m *member) running() bool {
	select {
	case <-m.done:
		return false
	default:
		return true
	}
}

// kill SIGKILLs the member and waits for it.
func (m *member) kill() {
	if m.running() {
		_ = m.cmd.Process.Kill()
		<-m.done
	}
}

// cluster is n members of one target.
type cluster struct {
	target  target
	members []*member
}

func (c *cluster) endpoints() []string {
	var eps []string
	for _, m := range c.members {
		if m.running() {
			eps = append(eps, m.client)
		}
	}
	return eps
}

// startCluster starts n members of tg and waits until a linearizable read answers. Every member
// is killed when the test ends; a failed test prints the tail of each member's log.
func startCluster(t *testing.T, tg target, n int) *cluster {
	t.Helper()
	return startClusterWith(t, tg, n)
}

// start runs the member's process (again, after a kill: same flags, same data dir), its output
// appended to its log.
func (m *member) start(t testing.TB) {
	t.Helper()
	logFile, err := os.OpenFile(m.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(m.bin, m.args...)
	cmd.Env = append(os.Environ(), "LEASEHOLD_LOG=warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", m.bin, err)
	}
	done := make(chan struct{})
	m.cmd, m.done = cmd, done
	go func() { _ = cmd.Wait(); logFile.Close(); close(done) }()
}

// startClusterWith is startCluster with extra flags for every member.
func startClusterWith(t testing.TB, tg target, n int, extra ...string) *cluster {
	t.Helper()
	dir := t.TempDir()
	ports := freePorts(t, 2*n)
	var initial []string
	for i := 0; i < n; i++ {
		initial = append(initial, fmt.Sprintf("m%d=http://127.0.0.1:%d", i, ports[2*i+1]))
	}
	c := &cluster{target: tg}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("m%d", i)
		client := fmt.Sprintf("http://127.0.0.1:%d", ports[2*i])
		peer := fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1])
		args := append([]string{
			"--name", name, "--data-dir", filepath.Join(dir, name),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-token", "clientv3-diff", "--initial-cluster-state", "new",
			"--log-level", "warn"}, extra...)
		m := &member{name: name, client: client, log: filepath.Join(dir, name+".log"), bin: tg.bin, args: args}
		m.start(t)
		c.members = append(c.members, m)
	}
	t.Cleanup(func() {
		for _, m := range c.members {
			m.kill()
			if t.Failed() {
				b, _ := os.ReadFile(m.log)
				if len(b) > 4000 {
					b = b[len(b)-4000:]
				}
				t.Logf("--- %s %s log tail ---\n%s", tg.name, m.name, b)
			}
		}
	})
	cli := c.client(t)
	deadline := time.Now().Add(readyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Get(ctx, "ready-probe")
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s cluster of %d: no answer within %s: %v", tg.name, n, readyTimeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return c
}

// client is a clientv3 client over every running member, closed when the test ends.
func (c *cluster) client(t testing.TB) *clientv3.Client {
	t.Helper()
	return newClient(t, c.endpoints())
}

// memberClient is a client of one member only.
func (c *cluster) memberClient(t testing.TB, m *member) *clientv3.Client {
	t.Helper()
	return newClient(t, []string{m.client})
}

func newClient(t testing.TB, endpoints []string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// leader is the member that says it leads, asked through each member's Status.
func (c *cluster) leader(t testing.TB) *member {
	t.Helper()
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		for _, m := range c.members {
			if !m.running() {
				continue
			}
			cli := c.memberClient(t, m)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := cli.Status(ctx, m.client)
			cancel()
			if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
				return m
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: no member says it leads", c.target.name)
	return nil
}

// term is the Raft term m reports in its Status.
func (c *cluster) term(t testing.TB, m *member) uint64 {
	t.Helper()
	cli := c.memberClient(t, m)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := cli.Status(ctx, m.client)
	if err != nil {
		t.Fatalf("%s: status of %s: %v", c.target.name, m.name, err)
	}
	return st.RaftTerm
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	t.Cleanup(cancel)
	return ctx
}

// transcript is what a scenario observed, one line per observation.
type transcript struct{ lines []string }

func (tr *transcript) add(format string, args ...any) {
	tr.lines = append(tr.lines, fmt.Sprintf(format, args...))
}

// differential runs scenario on a fresh cluster of n members of each target and fails the test
// when the transcripts differ, printing both from the first line that differs.
func differential(t *testing.T, n int, scenario func(t *testing.T, c *cluster, tr *transcript)) {
	t.Helper()
	var got []transcript
	tgs := targets(t)
	for _, tg := range tgs {
		var tr transcript
		ok := t.Run(tg.name, func(t *testing.T) {
			c := startCluster(t, tg, n)
			scenario(t, c, &tr)
		})
		if !ok {
			return
		}
		got = append(got, tr)
	}
	a, b := got[0].lines, got[1].lines
	for i := 0; i < len(a) || i < len(b); i++ {
		var la, lb string
		if i < len(a) {
			la = a[i]
		}
		if i < len(b) {
			lb = b[i]
		}
		if la != lb {
			t.Fatalf("transcripts differ at line %d:\n  %s: %q\n  %s: %q\nwhole %s transcript:\n  %s\nwhole %s transcript:\n  %s",
				i+1, tgs[0].name, la, tgs[1].name, lb,
				tgs[0].name, strings.Join(a, "\n  "), tgs[1].name, strings.Join(b, "\n  "))
		}
	}
	if len(a) == 0 {
		t.Fatal("the scenario recorded nothing")
	}
	t.Logf("both transcripts:\n  %s", strings.Join(a, "\n  "))
}
