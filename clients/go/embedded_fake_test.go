package snowkeep

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	pb "example.invalid/snowkeep/clients/go/gen/snowkeepv1"
)

// testClock is a clock moved by hand: wall and monotonic time move together
// with advance, the wall clock alone with stepWall; sleepers wake when
// advance reaches their end. In auto mode a sleep advances the clock itself
// and returns at once (for generator tests that wait out ticks).
type testClock struct {
	mu       sync.Mutex
	unixNs   int64
	monoNow  time.Duration
	auto     bool
	sleepers []*sleeper
	slept    []time.Duration // every positive sleep asked, in order
}

type sleeper struct {
	until, d time.Duration
	ch       chan struct{}
}

// layoutMs is the test layouts' "now": 1,000,000 ms after the default epoch.
const layoutMs = 1_000_000

func newTestClock() *testClock {
	return &testClock{unixNs: (epoch + layoutMs) * int64(time.Millisecond), monoNow: time.Hour}
}

func (c *testClock) now() (int64, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unixNs, c.monoNow
}

func (c *testClock) mono() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.monoNow
}

func (c *testClock) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	c.mu.Lock()
	c.slept = append(c.slept, d)
	if c.auto {
		c.unixNs += int64(d)
		c.monoNow += d
		c.mu.Unlock()
		return ctx.Err()
	}
	s := &sleeper{until: c.monoNow + d, d: d, ch: make(chan struct{})}
	c.sleepers = append(c.sleepers, s)
	c.mu.Unlock()
	select {
	case <-s.ch:
		return nil
	case <-ctx.Done():
		c.mu.Lock()
		c.sleepers = slices.DeleteFunc(c.sleepers, func(x *sleeper) bool { return x == s })
		c.mu.Unlock()
		return ctx.Err()
	}
}

// advance moves both clocks by d and wakes the sleepers whose end it reaches.
func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unixNs += int64(d)
	c.monoNow += d
	c.sleepers = slices.DeleteFunc(c.sleepers, func(s *sleeper) bool {
		if s.until <= c.monoNow {
			close(s.ch)
			return true
		}
		return false
	})
}

// stepWall steps the wall clock alone (a clock step, either way).
func (c *testClock) stepWall(d time.Duration) {
	c.mu.Lock()
	c.unixNs += int64(d)
	c.mu.Unlock()
}

// waitSleepers waits (in real time, at most 5 s) until exactly n sleepers
// are parked, and returns their durations, shortest first.
func (c *testClock) waitSleepers(t *testing.T, n int) []time.Duration {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; {
		c.mu.Lock()
		ds := make([]time.Duration, 0, len(c.sleepers))
		for _, s := range c.sleepers {
			ds = append(ds, s.d)
		}
		c.mu.Unlock()
		if len(ds) == n {
			slices.Sort(ds)
			return ds
		}
		if time.Now().After(end) {
			t.Fatalf("waited for %d sleepers, have %v", n, ds)
		}
		time.Sleep(time.Millisecond)
	}
}

// sleptSoFar is every positive sleep asked so far.
func (c *testClock) sleptSoFar() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.slept)
}

// fakeLease is an in-process double of our LeaseService on a loopback port:
// each call is answered by its script (a default when nil) and recorded
// with the test clock's monotonic time of its arrival.
type fakeLease struct {
	pb.UnimplementedLeaseServiceServer
	addr string
	clk  *testClock

	mu        sync.Mutex
	acquires  []*pb.AcquireRequest
	renews    []*pb.RenewRequest
	renewAt   []time.Duration
	checks    []*pb.CheckRequest
	checkAt   []time.Duration
	releases  []*pb.ReleaseRequest
	auth      []string
	released  chan *pb.ReleaseRequest
	acquireFn func(n int, r *pb.AcquireRequest) (*pb.LeaseGrant, error)
	renewFn   func(n int, r *pb.RenewRequest) (*pb.LeaseGrant, error)
	checkFn   func(n int, r *pb.CheckRequest) (*pb.CheckResponse, error)
	// grant is the default answer of Acquire and (with renewMs) of Renew.
	grant   *pb.LeaseGrant
	renewMs uint64
}

// discardLogger keeps tests quiet.
var discardLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

const testToken = "7f3a000000000000000000000000000000000000000000000000000000000001"

// defaultLayout is 41/12/10 in 1 ms units from the default epoch.
func defaultLayout() *pb.Layout {
	return &pb.Layout{TimestampBits: 41, MachineBits: 12, SequenceBits: 10, EpochUnixMs: epoch, TimeUnitMs: 1}
}

// grantOf grants machine ids with one floor and fence (layout ms) for
// expiresMs, under the default layout.
func grantOf(floor, fence, expiresMs uint64, ids ...uint32) *pb.LeaseGrant {
	g := &pb.LeaseGrant{ExpiresInMs: expiresMs, LeaseDurationMs: expiresMs, Layout: defaultLayout(),
		LeaseToken: testToken, NamespaceIncarnation: 0xabc}
	for _, id := range ids {
		g.MachineIds = append(g.MachineIds, &pb.LeasedMachineId{MachineId: id, FloorMs: floor, FenceMs: fence})
	}
	return g
}

func newFakeLease(t *testing.T, clk *testClock, opts ...grpc.ServerOption) *fakeLease {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeLease{addr: lis.Addr().String(), clk: clk, released: make(chan *pb.ReleaseRequest, 4),
		grant: grantOf(layoutMs-10, layoutMs+600_000, 600_000, 5), renewMs: 172_800_000}
	srv := grpc.NewServer(opts...)
	pb.RegisterLeaseServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return f
}

func (f *fakeLease) url() string { return "http://" + f.addr }

func (f *fakeLease) record(ctx context.Context) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.auth = append(f.auth, md.Get("authorization")...)
}

func (f *fakeLease) Acquire(ctx context.Context, r *pb.AcquireRequest) (*pb.LeaseGrant, error) {
	f.mu.Lock()
	f.record(ctx)
	f.acquires = append(f.acquires, r)
	n, fn := len(f.acquires), f.acquireFn
	f.mu.Unlock()
	if fn != nil {
		return fn(n, r)
	}
	return f.grant, nil
}

func (f *fakeLease) Renew(ctx context.Context, r *pb.RenewRequest) (*pb.LeaseGrant, error) {
	f.mu.Lock()
	f.record(ctx)
	f.renews = append(f.renews, r)
	f.renewAt = append(f.renewAt, f.clk.mono())
	n, fn := len(f.renews), f.renewFn
	f.mu.Unlock()
	if fn != nil {
		return fn(n, r)
	}
	g := &pb.LeaseGrant{ExpiresInMs: f.renewMs, LeaseDurationMs: f.renewMs, Layout: f.grant.Layout,
		NamespaceIncarnation: f.grant.NamespaceIncarnation}
	unixNs, _ := f.clk.now()
	for _, m := range f.grant.MachineIds {
		// The fence 10 minutes ahead of the (test) clock, as a server keeps it.
		g.MachineIds = append(g.MachineIds, &pb.LeasedMachineId{MachineId: m.MachineId,
			FloorMs: m.FloorMs, FenceMs: uint64(unixNs/1e6) - epoch + 600_000})
	}
	return g, nil
}

func (f *fakeLease) Check(ctx context.Context, r *pb.CheckRequest) (*pb.CheckResponse, error) {
	f.mu.Lock()
	f.record(ctx)
	f.checks = append(f.checks, r)
	f.checkAt = append(f.checkAt, f.clk.mono())
	n, fn := len(f.checks), f.checkFn
	f.mu.Unlock()
	if fn != nil {
		return fn(n, r)
	}
	return &pb.CheckResponse{Valid: true, Reason: pb.LeaseCheckReason_LEASE_CHECK_REASON_VALID}, nil
}

func (f *fakeLease) Release(ctx context.Context, r *pb.ReleaseRequest) (*pb.ReleaseResponse, error) {
	f.mu.Lock()
	f.record(ctx)
	f.releases = append(f.releases, r)
	f.mu.Unlock()
	f.released <- r
	return &pb.ReleaseResponse{Released: uint32(len(f.grant.MachineIds))}, nil
}

// calls is a copy of the calls recorded so far.
func (f *fakeLease) calls() (acquires []*pb.AcquireRequest, renews []*pb.RenewRequest, renewAt []time.Duration,
	checks []*pb.CheckRequest, checkAt []time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.acquires), slices.Clone(f.renews), slices.Clone(f.renewAt),
		slices.Clone(f.checks), slices.Clone(f.checkAt)
}

// counts is how many Acquire, Renew, Check and Release calls arrived.
func (f *fakeLease) counts() [4]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return [4]int{len(f.acquires), len(f.renews), len(f.checks), len(f.releases)}
}

// testConfig is a config for f's server on clk: namespace "ns", a fixed
// requester, checks every 30 s, no logging.
func testConfig(f *fakeLease, clk *testClock) EmbeddedConfig {
	return EmbeddedConfig{Endpoint: f.url(), Namespace: "ns", clock: clk, Logger: discardLogger,
		Requester: Requester{HostID: "host", PID: 42, StartUnixMs: 7, Nonce: "00ff"},
		jitter:    func() float64 { return 0.5 }}
}

// start starts a generator on f and registers its shutdown.
func start(t *testing.T, f *fakeLease, cfg EmbeddedConfig, opts ...Option) *EmbeddedGenerator {
	t.Helper()
	g, err := StartEmbedded(context.Background(), cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = g.Shutdown(context.Background()) })
	return g
}

// waitStopped waits (at most 5 s) for g to stop and returns Err.
func waitStopped(t *testing.T, g *EmbeddedGenerator) error {
	t.Helper()
	select {
	case <-g.Stopped():
		return g.Err()
	case <-time.After(5 * time.Second):
		t.Fatal("the generator did not stop")
		return nil
	}
}
