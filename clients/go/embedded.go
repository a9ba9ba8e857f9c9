package snowkeep

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	pb "example.invalid/snowkeep/clients/go/gen/snowkeepv1"
)

// Defaults of EmbeddedConfig (the Rust EmbeddedConfig's, docs/api.md).
const (
	DefaultMaxBackwardWait   = 100 * time.Millisecond
	DefaultAcquireBackoff    = 3 * time.Second
	DefaultAcquireMaxBackoff = 60 * time.Second
	DefaultMaxFloorWait      = 30 * time.Second
	DefaultCheckInterval     = 30 * time.Second
	// DefaultEmbeddedRequestTimeout bounds one Lease API call unless
	// WithRequestTimeout says otherwise.
	DefaultEmbeddedRequestTimeout = 10 * time.Second
	// acquireJitter scales each Acquire retry delay by a factor in [0.8, 1.2].
	acquireJitter = 0.2
	// Renewal delays while behind: never more often than minRetry, never
	// less often than maxRetry.
	minRetry = 5 * time.Second
	maxRetry = 10 * time.Minute
)

// EmbeddedConfig is what StartEmbedded needs. Zero fields take the
// defaults named on them.
type EmbeddedConfig struct {
	// Endpoint is one snowkeep server running on etcd: "host:port",
	// "http://host:port" or "https://host:port" (TLS; see WithTLS).
	Endpoint string
	// Namespace must exist (snowkeep-server --create-namespace).
	Namespace string
	// MachineIDs is how many machine ids to hold, 1 (default) to 63; each
	// adds 2^SequenceBits ids per tick.
	MachineIDs int
	// Requester is who this process is; CurrentRequester() by default.
	Requester Requester
	// MaxBackwardWait is the largest backwards wall-clock step waited out
	// (default 100 ms); a larger one fails calls with ErrClockSteppedBack.
	MaxBackwardWait time.Duration
	// AcquireBackoff and AcquireMaxBackoff: the first and the largest delay
	// between Acquire attempts (3 s doubling to 60 s, each ±20 %).
	AcquireBackoff, AcquireMaxBackoff time.Duration
	// AcquireAttempts caps the Acquire attempts; 0 retries until ctx ends.
	AcquireAttempts int
	// MaxFloorWait is the longest StartEmbedded waits for the clock to pass
	// the granted floor (default 30 s); a clock further behind fails with
	// ErrGrantClockBehindFloor after releasing the grant.
	MaxFloorWait time.Duration
	// CheckInterval is how often LeaseService.Check asks whether the lease
	// still stands (default 30 s): the longest the generator goes on after
	// etcd lost the state behind it. Negative: never check.
	CheckInterval time.Duration
	// OmitClientTime stops sending the local clock with Acquire and Renew
	// (sent by default, so the server refuses a skewed clock at Acquire).
	OmitClientTime bool
	// Logger gets the generator's warnings (retries, stops); slog.Default()
	// when nil.
	Logger *slog.Logger
	// ClockOffset shifts the wall clock the generator reads (and sends to
	// the server) by this much, to test a host whose clock is ahead
	// (positive) or behind (negative) the servers' (the conformance suite's
	// clock_offset_ms). Leave it 0 in production; the monotonic clock is
	// never shifted.
	ClockOffset time.Duration

	// Test hooks: the clock, and the jitter draw in [0, 1).
	clock  clock
	jitter func() float64
}

func (c *EmbeddedConfig) fill() error {
	if c.Namespace == "" {
		return invalidArg("namespace: give the namespace to lease machine ids in")
	}
	if c.MachineIDs == 0 {
		c.MachineIDs = 1
	}
	if c.MachineIDs < 1 || c.MachineIDs > 63 {
		return invalidArg("machine_ids must be 1 to 63, got %d", c.MachineIDs)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.MaxBackwardWait, DefaultMaxBackwardWait)
	def(&c.AcquireBackoff, DefaultAcquireBackoff)
	def(&c.AcquireMaxBackoff, DefaultAcquireMaxBackoff)
	def(&c.MaxFloorWait, DefaultMaxFloorWait)
	def(&c.CheckInterval, DefaultCheckInterval)
	if c.MaxBackwardWait < 0 || c.AcquireBackoff < 0 || c.AcquireMaxBackoff < c.AcquireBackoff ||
		c.MaxFloorWait < 0 || c.AcquireAttempts < 0 {
		return invalidArg("durations must not be negative, and acquire_max_backoff not below acquire_backoff")
	}
	if c.Requester == (Requester{}) {
		c.Requester = CurrentRequester()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.clock == nil {
		c.clock = systemClock{}
	}
	if c.ClockOffset != 0 {
		c.clock = offsetClock{c.clock, c.ClockOffset}
	}
	if c.jitter == nil {
		c.jitter = rand.Float64
	}
	return nil
}

// EmbeddedGenerator generates ids in the application's own process from
// machine ids leased through a server's Lease API (snowkeep.v1.LeaseService):
// no network hop per id. It follows the Lease API contract of docs/api.md
// ("EmbeddedGenerator follows the Lease API contract") exactly as the Rust
// snowkeep_client::EmbeddedGenerator does, with the same generator rules
// (docs/design.md, the safety invariant): it stamps a timestamp only above
// each machine id's floor, at or below its persisted fence, and before the
// lease's local deadline by the monotonic clock; within one machine id
// timestamps never go back (a step back of up to MaxBackwardWait is waited
// out, a larger one refused).
//
// Safe for concurrent use. Ids are uint64 under the namespace's Layout;
// ids of one call are strictly ascending. Watch Stopped (or Err) for the
// end of the lease, and call Shutdown when done.
type EmbeddedGenerator struct {
	cfg       EmbeddedConfig
	timeout   time.Duration
	log       *slog.Logger
	clk       clock
	conn      *grpc.ClientConn
	api       pb.LeaseServiceClient
	requester Requester
	// token is the grant's lease token, kept in memory only, never logged.
	token       string
	layout      Layout
	machineIDs  []uint32
	incarnation uint64

	machines   []*machine
	next       atomic.Uint64 // round robin
	pins       atomic.Uint64 // Pin's turn
	workerPool sync.Pool     // NextIDByP's Workers

	stopMu  sync.Mutex
	stopErr atomic.Pointer[StopError]
	stopped chan struct{}

	cancel     context.CancelFunc
	loops      sync.WaitGroup
	shutOnce   sync.Once
	shutResult uint32
	shutErr    error
}

// StartEmbedded acquires cfg.MachineIDs machine ids in cfg.Namespace and
// starts renewing them; the generator it returns issues at once. Of opts,
// WithAPIKey (a key with the lease permission, when the cluster requires
// keys), WithTLS and WithRequestTimeout (one Lease API call, default 10 s)
// apply; the remote client's retry options do not.
//
// Acquire is retried while it fails with a retryable code (IsRetryableCode)
// every 3 s doubling to 60 s, ±20 % jitter, until ctx ends or
// AcquireAttempts are spent; other codes return at once as *Error (a clock
// skewed beyond the server's threshold is FAILED_PRECONDITION, retried). A
// PERMISSION_DENIED Acquire (this identity holds machine ids whose grant
// never reached us) starts over once, at once, under a fresh nonce.
//
// A grant it cannot use fails fast with a *GrantError (ErrGrantBadLayout,
// ErrGrantMachineIDOutOfRange, ErrGrantCount, ErrGrantExpired,
// ErrGrantClockPastFence, ErrGrantClockBehindFloor), after releasing it.
// Otherwise it waits (at most MaxFloorWait) for the clock to pass the
// previous holders' fences. Errors for a bad cfg or option are
// INVALID_ARGUMENT *Error. When ctx ends first the error wraps ctx.Err()
// (errors.Is works) and names the last Acquire failure, if any.
func StartEmbedded(ctx context.Context, cfg EmbeddedConfig, opts ...Option) (*EmbeddedGenerator, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	cc := config{requestTimeout: DefaultEmbeddedRequestTimeout, retryBudget: DefaultRetryBudget,
		backoff: DefaultBackoff, maxBackoff: DefaultMaxBackoff}
	for _, o := range opts {
		o(&cc)
	}
	if err := cc.validate(); err != nil {
		return nil, err
	}
	ep, err := parseEndpoint(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := loadTLS(cc.tls)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("passthrough:///"+ep.target, dialOptions(cc, ep, tlsCfg)...)
	if err != nil {
		return nil, invalidArg("endpoint: %q: %v", ep.raw, err)
	}
	e := &EmbeddedGenerator{cfg: cfg, timeout: cc.requestTimeout, log: cfg.Logger, clk: cfg.clock,
		conn: conn, api: pb.NewLeaseServiceClient(conn), requester: cfg.Requester,
		stopped: make(chan struct{})}
	g, sent, err := e.acquire(ctx)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	// From here on the server holds machine ids for us: every failure gives
	// them back before it returns.
	e.token = g.GetLeaseToken()
	if err := e.accept(ctx, g, sent); err != nil {
		released, rerr := e.release(context.WithoutCancel(ctx), nil)
		e.log.Warn("snowkeep: refused the grant and released it", "namespace", cfg.Namespace,
			"released", released, "release_error", rerr, "error", err)
		_ = conn.Close()
		return nil, err
	}
	return e, nil
}

// acquire calls Acquire until it succeeds, under the retry rule of
// StartEmbedded; it returns the grant and when its request was sent
// (monotonic).
func (e *EmbeddedGenerator) acquire(ctx context.Context) (*pb.LeaseGrant, time.Duration, error) {
	delay, switched := e.cfg.AcquireBackoff, false
	var last error
	ended := func() error {
		if last == nil {
			return ctx.Err()
		}
		return fmt.Errorf("snowkeep: %w while acquiring (last Acquire failure: %v)", ctx.Err(), last)
	}
	for attempt := 1; ; attempt++ {
		sent := e.clk.mono()
		req := &pb.AcquireRequest{Requester: e.requester.toPB(), Namespace: e.cfg.Namespace,
			Count: uint32(e.cfg.MachineIDs), ClientTimeUnixMs: e.clientTime(),
			SupportsLayoutShapes: true}
		cctx, cancel := context.WithTimeout(ctx, e.timeout)
		g, err := e.api.Acquire(cctx, req)
		cancel()
		if err == nil {
			return g, sent, nil
		}
		if ctx.Err() != nil {
			return nil, 0, ended()
		}
		rerr := fromRPC(err)
		last = rerr
		if !switched && rerr.Code() == codes.PermissionDenied {
			// A grant whose answer was lost holds machine ids under a token
			// we never got: start over at once as a new requester.
			switched, attempt = true, attempt-1
			e.requester = e.requester.WithNewNonce()
			e.log.Warn("snowkeep: this requester already holds machine ids without our lease token "+
				"(an earlier Acquire answer was lost?); acquiring as a new requester",
				"namespace", e.cfg.Namespace, "requester", e.requester.Tag())
			continue
		}
		if !rerr.Retryable() || (e.cfg.AcquireAttempts > 0 && attempt >= e.cfg.AcquireAttempts) {
			return nil, 0, rerr
		}
		wait := time.Duration(float64(delay) * (1 + acquireJitter*(2*e.cfg.jitter()-1)))
		delay = min(2*delay, e.cfg.AcquireMaxBackoff)
		e.log.Warn("snowkeep: Acquire failed; retrying", "namespace", e.cfg.Namespace,
			"error", rerr, "retry_in", wait)
		if err := e.clk.sleep(ctx, wait); err != nil {
			return nil, 0, ended()
		}
	}
}

func (e *EmbeddedGenerator) clientTime() *uint64 {
	if e.cfg.OmitClientTime {
		return nil
	}
	unixNs, _ := e.clk.now()
	ms := uint64(max(unixNs, 0) / int64(time.Millisecond))
	return &ms
}

// checkGrant checks a grant against what was asked and returns its layout.
func checkGrant(g *pb.LeaseGrant, asked int) (Layout, error) {
	if g.GetLayout() == nil {
		return Layout{}, &GrantError{Kind: ErrGrantBadLayout, Detail: "the grant carries no layout"}
	}
	l := layoutFromPB(g.GetLayout())
	if err := l.Validate(); err != nil {
		return Layout{}, &GrantError{Kind: ErrGrantBadLayout, Detail: err.(*Error).Message()}
	}
	if len(g.GetMachineIds()) != asked {
		return Layout{}, &GrantError{Kind: ErrGrantCount,
			Detail: fmt.Sprintf("asked for %d machine ids, the server granted %d", asked, len(g.GetMachineIds()))}
	}
	seen := make(map[uint32]bool, asked)
	for _, m := range g.GetMachineIds() {
		if m.GetMachineId() >= 1<<l.MachineBits {
			return Layout{}, &GrantError{Kind: ErrGrantMachineIDOutOfRange,
				Detail: fmt.Sprintf("machine id %d is outside %d machine bits", m.GetMachineId(), l.MachineBits)}
		}
		if seen[m.GetMachineId()] {
			// Two slots on one machine id would stamp the same ids.
			return Layout{}, &GrantError{Kind: ErrGrantCount, Detail: fmt.Sprintf(
				"machine id %d is granted twice: fewer than the %d machine ids asked for", m.GetMachineId(), asked)}
		}
		seen[m.GetMachineId()] = true
	}
	if g.GetExpiresInMs() == 0 {
		return Layout{}, &GrantError{Kind: ErrGrantExpired, Detail: "expires_in_ms is 0"}
	}
	return l, nil
}

// pastFence is how far wall time unixNs is past the earliest fence of g
// under l; 0 while it is at or below every fence.
func pastFence(l Layout, unixNs int64, g *pb.LeaseGrant) time.Duration {
	unixMs := uint64(max(unixNs, 0) / int64(time.Millisecond))
	if unixMs < l.EpochUnixMs || len(g.GetMachineIds()) == 0 {
		return 0
	}
	now := unixMs - l.EpochUnixMs
	fence := g.GetMachineIds()[0].GetFenceMs()
	for _, m := range g.GetMachineIds() {
		fence = min(fence, m.GetFenceMs())
	}
	if now <= fence {
		return 0
	}
	return time.Duration(now-fence) * time.Millisecond
}

// accept checks a fresh grant, publishes it, waits for the clock to pass
// its floor and starts the renewer and the checker; the caller releases the
// grant when it fails.
func (e *EmbeddedGenerator) accept(ctx context.Context, g *pb.LeaseGrant, sent time.Duration) error {
	l, err := checkGrant(g, e.cfg.MachineIDs)
	if err != nil {
		return err
	}
	unixNs, mono := e.clk.now()
	deadline := sent + time.Duration(g.GetExpiresInMs())*time.Millisecond
	if mono >= deadline {
		return &GrantError{Kind: ErrGrantExpired, Detail: fmt.Sprintf(
			"the lease of %d ms ended by the local clock before its grant arrived", g.GetExpiresInMs())}
	}
	if past := pastFence(l, unixNs, g); past > 0 {
		return &GrantError{Kind: ErrGrantClockPastFence, Wait: past, Detail: fmt.Sprintf(
			"the local clock is %v past the granted fence, so no id could be stamped: it is ahead of "+
				"the server's by more than the lease covers; sync it with NTP", past)}
	}
	var maxFloor uint64
	for _, m := range g.GetMachineIds() {
		maxFloor = max(maxFloor, m.GetFloorMs())
	}
	var now uint64
	if unixMs := uint64(max(unixNs, 0) / int64(time.Millisecond)); unixMs > l.EpochUnixMs {
		now = unixMs - l.EpochUnixMs
	}
	wait := time.Duration(max(l.firstStampAfter(maxFloor), now)-now) * time.Millisecond
	// Never wait past the lease either: it would end before the first id.
	limit := min(e.cfg.MaxFloorWait, max(deadline-mono, 0))
	if wait > limit {
		return &GrantError{Kind: ErrGrantClockBehindFloor, Wait: wait, Max: limit, Detail: fmt.Sprintf(
			"the local clock is %v behind the granted machine ids' floor, more than the %v a start "+
				"waits: sync this host with NTP (or raise EmbeddedConfig.MaxFloorWait)", wait, limit)}
	}
	e.layout = l
	for _, m := range g.GetMachineIds() {
		e.machineIDs = append(e.machineIDs, m.GetMachineId())
		e.machines = append(e.machines, newMachine(l, e.clk, e.cfg.MaxBackwardWait))
	}
	e.incarnation = g.GetNamespaceIncarnation()
	e.workerPool.New = func() any { return e.Pin() }
	e.publish(g, sent)
	if err := e.clk.sleep(ctx, wait); err != nil {
		return err
	}
	e.log.Info("snowkeep: embedded generator leased machine ids", "namespace", e.cfg.Namespace,
		"requester", e.requester.Tag(), "machine_ids", e.machineIDs)
	loopCtx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	e.loops.Add(2)
	go func() { defer e.loops.Done(); e.renewLoop(loopCtx, deadline) }()
	go func() { defer e.loops.Done(); e.checkLoop(loopCtx) }()
	return nil
}

// publish puts a checked grant in force, its deadline counted from sent;
// nothing once the generator stopped (stop and publish hold stopMu, so a
// renewal that races a stop never undoes it).
func (e *EmbeddedGenerator) publish(g *pb.LeaseGrant, sent time.Duration) {
	deadline := sent + time.Duration(g.GetExpiresInMs())*time.Millisecond
	e.stopMu.Lock()
	defer e.stopMu.Unlock()
	if e.stopErr.Load() != nil {
		return
	}
	for i, m := range g.GetMachineIds() {
		e.machines[i].publish(grant{machineID: m.GetMachineId(), floor: m.GetFloorMs(),
			fence: m.GetFenceMs(), deadline: deadline})
	}
}
