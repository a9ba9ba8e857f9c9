package snowkeep

import (
	"context"
	"crypto/tls"
	"errors"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	pb "example.invalid/snowkeep/clients/go/gen/snowkeepv1"
)

const t0 = time.Hour // the test clock's monotonic start

func TestStartIssuesExactIDsRenewsAtOnceThenAtHalfTheLeaseAndChecks(t *testing.T) {
	clk := newTestClock()
	f := newFakeLease(t, clk)
	g := start(t, f, testConfig(f, clk))
	id, err := g.NextID(context.Background())
	if err != nil || id != uint64(layoutMs)<<22|5<<10 {
		t.Fatalf("%d %v", id, err)
	}
	if !slices.Equal(g.MachineIDs(), []uint32{5}) || g.Layout() != layoutFromPB(defaultLayout()) || !g.Ready() {
		t.Fatal(g.MachineIDs(), g.Layout(), g.Ready())
	}
	// The renewer renewed at once (48 h lease: next at 24 h); the checker waits 30 s.
	if ds := clk.waitSleepers(t, 2); !slices.Equal(ds, []time.Duration{30 * time.Second, 24 * time.Hour}) {
		t.Fatal(ds)
	}
	acquires, renews, renewAt, _, _ := f.calls()
	a, r := acquires[0], renews[0]
	wantReq := &pb.Requester{HostId: "host", Pid: 42, StartUnixMs: 7, Nonce: "00ff"}
	if a.GetNamespace() != "ns" || a.GetCount() != 1 || !a.GetSupportsLayoutShapes() ||
		a.GetClientTimeUnixMs() != epoch+layoutMs || a.GetLeaseToken() != "" || !sameRequester(a.GetRequester(), wantReq) {
		t.Fatalf("acquire %v", a)
	}
	if r.GetLeaseToken() != testToken || r.GetNamespaceIncarnation() != 0xabc ||
		r.GetClientTimeUnixMs() != epoch+layoutMs || !sameRequester(r.GetRequester(), wantReq) || renewAt[0] != t0 {
		t.Fatalf("renew %v at %v", r, renewAt)
	}
	clk.advance(30 * time.Second)
	clk.waitSleepers(t, 2)
	_, _, _, checks, checkAt := f.calls()
	c := checks[0]
	if checkAt[0] != t0+30*time.Second || c.GetLeaseToken() != testToken || c.GetNamespaceIncarnation() != 0xabc ||
		!slices.Equal(c.GetMachineIds(), []uint32{5}) || c.GetNamespace() != "ns" {
		t.Fatalf("check %v at %v", c, checkAt)
	}
	clk.advance(24*time.Hour - 30*time.Second)
	clk.waitSleepers(t, 2)
	_, _, renewAt, _, _ = f.calls()
	if n := f.counts(); n[1] != 2 || renewAt[1] != t0+24*time.Hour {
		t.Fatalf("renews %v at %v", n, renewAt)
	}
}

func sameRequester(a, b *pb.Requester) bool {
	return a.GetHostId() == b.GetHostId() && a.GetPid() == b.GetPid() &&
		a.GetStartUnixMs() == b.GetStartUnixMs() && a.GetNonce() == b.GetNonce()
}

func TestAcquireRetriesEvery3sDoublingTo60sWithJitter(t *testing.T) {
	clk := newTestClock()
	f := newFakeLease(t, clk)
	f.acquireFn = func(n int, _ *pb.AcquireRequest) (*pb.LeaseGrant, error) {
		if n <= 7 {
			return nil, status.Error(codes.Unavailable, "etcd down")
		}
		return f.grant, nil
	}
	draws := []float64{0, 1, 0.5, 0.25, 0.75, 0.5, 0}
	cfg := testConfig(f, clk)
	cfg.CheckInterval = -1
	cfg.jitter = func() float64 { r := draws[0]; draws = draws[1:]; return r }
	type result struct {
		g   *EmbeddedGenerator
		err error
	}
	done := make(chan result, 1)
	go func() {
		g, err := StartEmbedded(context.Background(), cfg)
		done <- result{g, err}
	}()
	bases := []time.Duration{3, 6, 12, 24, 48, 60, 60}
	factors := []float64{0.8, 1.2, 1, 0.9, 1.1, 1, 0.8} // 1 + 0.2 × (2 × draw - 1)
	for i, base := range bases {
		want := time.Duration(float64(base*time.Second) * (1 + 0.2*(2*[]float64{0, 1, 0.5, 0.25, 0.75, 0.5, 0}[i]-1)))
		ds := clk.waitSleepers(t, 1)
		if ds[0] != want || want.Round(time.Millisecond) != time.Duration(float64(base*time.Second)*factors[i]).Round(time.Millisecond) {
			t.Fatalf("retry %d: slept %v, want %v", i+1, ds[0], want)
		}
		clk.advance(ds[0])
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.g.Shutdown(context.Background())
	if n := f.counts(); n[0] != 8 {
		t.Fatal(n)
	}
	acquires, _, _, _, _ := f.calls()
	for _, a := range acquires {
		if a.GetRequester().GetNonce() != "00ff" { // one requester: the retries are idempotent
			t.Fatal(a)
		}
	}
}

func TestAcquireGivesUpOnOtherCodesAfterItsAttemptsAndWithItsContext(t *testing.T) {
	clk := newTestClock()
	f := newFakeLease(t, clk)
	f.acquireFn = func(int, *pb.AcquireRequest) (*pb.LeaseGrant, error) {
		return nil, status.Error(codes.InvalidArgument, "bad namespace")
	}
	_, err := StartEmbedded(context.Background(), testConfig(f, clk))
	wantCode(t, err, codes.InvalidArgument, "bad namespace")
	if n := f.counts(); n[0] != 1 || len(clk.sleptSoFar()) != 0 {
		t.Fatal(n, clk.sleptSoFar())
	}

	f.acquireFn = func(int, *pb.AcquireRequest) (*pb.LeaseGrant, error) {
		return nil, status.Error(codes.ResourceExhausted, "no free machine ids")
	}
	cfg := testConfig(f, clk)
	cfg.AcquireAttempts = 2
	done := make(chan error, 1)
	go func() { _, err := StartEmbedded(context.Background(), cfg); done <- err }()
	clk.advance(clk.waitSleepers(t, 1)[0])
	wantCode(t, <-done, codes.ResourceExhausted, "no free machine ids")
	if n := f.counts(); n[0] != 3 {
		t.Fatal(n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	go func() { _, err := StartEmbedded(ctx, testConfig(f, clk)); done <- err }()
	clk.waitSleepers(t, 1)
	cancel()
	// The context's end, still errors.Is-able, with the cause that kept
	// the start retrying (a user sees why, not only that it timed out).
	err = <-done
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "no free machine ids") {
		t.Fatal(err)
	}
}

func TestAPermissionDeniedAcquireStartsOverOnceAsANewRequester(t *testing.T) {
	clk := newTestClock()
	f := newFakeLease(t, clk)
	f.acquireFn = func(n int, _ *pb.AcquireRequest) (*pb.LeaseGrant, error) {
		if n == 1 {
			return nil, status.Error(codes.PermissionDenied, "held under another token")
		}
		return f.grant, nil
	}
	cfg := testConfig(f, clk)
	cfg.CheckInterval = -1
	g := start(t, f, cfg)
	acquires, _, _, _, _ := f.calls()
	nonce := acquires[1].GetRequester().GetNonce()
	// At once: no Acquire backoff was slept (only the renewer's 24 h, if it got there).
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(nonce) || g.Requester().Nonce != nonce ||
		acquires[0].GetRequester().GetNonce() != "00ff" ||
		slices.ContainsFunc(clk.sleptSoFar(), func(d time.Duration) bool { return d < time.Hour }) {
		t.Fatal(nonce, g.Requester(), clk.sleptSoFar())
	}
	// Twice refused: not retried again.
	f.acquireFn = func(int, *pb.AcquireRequest) (*pb.LeaseGrant, error) {
		return nil, status.Error(codes.PermissionDenied, "held under another token")
	}
	_, err := StartEmbedded(context.Background(), testConfig(f, clk))
	wantCode(t, err, codes.PermissionDenied, "another token")
}

func TestEachFailFastRuleReleasesTheGrantBeforeReturning(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(g *pb.LeaseGrant, c *EmbeddedConfig)
		kind  error
		wait  time.Duration
		limit time.Duration
	}{
		{"no layout", func(g *pb.LeaseGrant, _ *EmbeddedConfig) { g.Layout = nil }, ErrGrantBadLayout, 0, 0},
		{"bad layout", func(g *pb.LeaseGrant, _ *EmbeddedConfig) { g.Layout.SequenceBits = 11 }, ErrGrantBadLayout, 0, 0},
		{"bad unit", func(g *pb.LeaseGrant, _ *EmbeddedConfig) { g.Layout.TimeUnitMs = 7 }, ErrGrantBadLayout, 0, 0},
		{"machine id", func(g *pb.LeaseGrant, _ *EmbeddedConfig) { g.MachineIds[0].MachineId = 4096 },
			ErrGrantMachineIDOutOfRange, 0, 0},
		{"count", func(_ *pb.LeaseGrant, c *EmbeddedConfig) { c.MachineIDs = 2 }, ErrGrantCount, 0, 0},
		{"expired", func(g *pb.LeaseGrant, _ *EmbeddedConfig) { g.ExpiresInMs = 0 }, ErrGrantExpired, 0, 0},
		{"past fence", func(g *pb.LeaseGrant, _ *EmbeddedConfig) { g.MachineIds[0].FenceMs = layoutMs - 3 },
			ErrGrantClockPastFence, 3 * time.Millisecond, 0},
		{"behind floor", func(g *pb.LeaseGrant, _ *EmbeddedConfig) { g.MachineIds[0].FloorMs = layoutMs + 30_001 },
			ErrGrantClockBehindFloor, 30_002 * time.Millisecond, 30 * time.Second},
		{"behind floor past the lease", func(g *pb.LeaseGrant, _ *EmbeddedConfig) {
			g.ExpiresInMs, g.MachineIds[0].FloorMs = 10_000, layoutMs+20_000
		}, ErrGrantClockBehindFloor, 20_001 * time.Millisecond, 10 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := newTestClock()
			f := newFakeLease(t, clk)
			cfg := testConfig(f, clk)
			tc.edit(f.grant, &cfg)
			_, err := StartEmbedded(context.Background(), cfg)
			var ge *GrantError
			if !errors.Is(err, tc.kind) || !errors.As(err, &ge) || ge.Wait != tc.wait || ge.Max != tc.limit ||
				status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("%v (%+v)", err, ge)
			}
			rel := <-f.released
			if rel.GetLeaseToken() != testToken || rel.GetNamespace() != "ns" || len(rel.GetLastUsedMs()) != 0 ||
				rel.GetRequester().GetNonce() != "00ff" {
				t.Fatal(rel)
			}
			if n := f.counts(); n != [4]int{1, 0, 0, 1} {
				t.Fatal(n)
			}
		})
	}
}

func TestStartWaitsForTheClockToPassTheFloorThenIssuesAboveIt(t *testing.T) {
	clk := newTestClock()
	f := newFakeLease(t, clk)
	f.grant.MachineIds[0].FloorMs = layoutMs + 5
	done := make(chan *EmbeddedGenerator, 1)
	go func() { g, _ := StartEmbedded(context.Background(), testConfig(f, clk)); done <- g }()
	if ds := clk.waitSleepers(t, 1); ds[0] != 6*time.Millisecond {
		t.Fatal(ds)
	}
	clk.advance(6 * time.Millisecond)
	g := <-done
	defer g.Shutdown(context.Background())
	if id, err := g.NextID(context.Background()); id != uint64(layoutMs+6)<<22|5<<10 || err != nil {
		t.Fatal(id, err)
	}
}

func TestFailedRenewalsRetryAtAQuarterOfWhatIsLeftThenStopAtTheDeadline(t *testing.T) {
	clk := newTestClock()
	f := newFakeLease(t, clk)
	f.renewFn = func(n int, _ *pb.RenewRequest) (*pb.LeaseGrant, error) {
		if n == 1 {
			return grantOf(layoutMs-10, layoutMs+600_000, 60_000, 5), nil
		}
		return nil, status.Error(codes.Unavailable, "etcd down")
	}
	cfg := testConfig(f, clk)
	cfg.CheckInterval = -1
	g := start(t, f, cfg)
	want := []time.Duration{30 * time.Second, 7500 * time.Millisecond, 5625 * time.Millisecond,
		5 * time.Second, 5 * time.Second, 5 * time.Second, 1875 * time.Millisecond}
	for _, w := range want {
		if ds := clk.waitSleepers(t, 1); ds[0] != w {
			t.Fatalf("slept %v, want %v (all: %v)", ds[0], w, clk.sleptSoFar())
		}
		if _, err := g.NextID(context.Background()); err != nil {
			t.Fatal(err) // issuing goes on below the fence while renewals fail
		}
		clk.advance(w)
	}
	err := waitStopped(t, g)
	if !errors.Is(err, ErrStopExpired) || !errors.Is(err, ErrStopped) || f.counts()[1] != 7 {
		t.Fatal(err, f.counts())
	}
	if _, err := g.NextID(context.Background()); !errors.Is(err, ErrStopExpired) {
		t.Fatal(err)
	}
}

func TestEachRenewalStopRuleStopsIssuanceForGood(t *testing.T) {
	empty := func(r pb.LeaseCheckReason) *pb.LeaseGrant {
		return &pb.LeaseGrant{ExpiresInMs: 1000, Layout: defaultLayout(), GoneReason: r}
	}
	cases := []struct {
		name   string
		answer *pb.LeaseGrant
		err    error
		want   StopError
	}{
		{"empty", empty(0), nil, StopError{Reason: StopLeaseGone}},
		{"lease gone", empty(pb.LeaseCheckReason_LEASE_CHECK_REASON_LEASE_GONE), nil, StopError{Reason: StopLeaseGone}},
		{"namespace gone", empty(pb.LeaseCheckReason_LEASE_CHECK_REASON_NAMESPACE_GONE), nil,
			StopError{Reason: StopNamespaceGone}},
		{"rolled back", empty(pb.LeaseCheckReason_LEASE_CHECK_REASON_ROLLED_BACK), nil,
			StopError{Reason: StopNamespaceRolledBack}},
		{"other ids", grantOf(0, layoutMs+1000, 1000, 6), nil,
			StopError{Reason: StopMachineIDsChanged, Held: 1, Renewed: 1}},
		{"count", grantOf(0, layoutMs+1000, 1000, 5, 6), nil,
			StopError{Reason: StopMachineIDsChanged, Held: 1, Renewed: 2}},
		{"token", nil, status.Error(codes.PermissionDenied, "wrong token"), StopError{Reason: StopTokenRefused}},
		{"expired", grantOf(0, layoutMs+1000, 0, 5), nil, StopError{Reason: StopExpired}},
		{"past fence", grantOf(0, layoutMs-1, 1000, 5), nil,
			StopError{Reason: StopClockPastFence, Past: time.Millisecond}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := newTestClock()
			f := newFakeLease(t, clk)
			gate := make(chan struct{})
			f.renewFn = func(int, *pb.RenewRequest) (*pb.LeaseGrant, error) {
				<-gate
				return tc.answer, tc.err
			}
			g := start(t, f, testConfig(f, clk))
			w := g.Pin()
			if _, err := w.NextID(context.Background()); err != nil {
				t.Fatal(err)
			}
			close(gate)
			err := waitStopped(t, g)
			var se *StopError
			if !errors.As(err, &se) || *se != tc.want || !errors.Is(err, &StopError{Reason: tc.want.Reason}) {
				t.Fatalf("%v (%+v)", err, se)
			}
			for _, take := range []func(context.Context) (uint64, error){g.NextID, w.NextID} {
				if _, err := take(context.Background()); !errors.Is(err, ErrStopped) || status.Code(err) != codes.Unavailable {
					t.Fatal(err)
				}
			}
			if _, err := g.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			releases := f.counts()[3]
			if tc.want.Reason != StopClockPastFence {
				if releases != 0 { // a lease already gone is not released
					t.Fatal(releases)
				}
				return
			}
			rel := <-f.released
			if releases != 1 || !maps.Equal(rel.GetLastUsedMs(), map[uint32]uint64{5: layoutMs}) {
				t.Fatal(releases, rel)
			}
		})
	}
}

func TestEachCheckAnswerThatTheLeaseIsGoneStopsIssuance(t *testing.T) {
	cases := []struct {
		name   string
		answer *pb.CheckResponse
		err    error
		want   StopReason // 0: goes on issuing
	}{
		{"lease gone", &pb.CheckResponse{Reason: pb.LeaseCheckReason_LEASE_CHECK_REASON_LEASE_GONE}, nil, StopLeaseGone},
		{"namespace gone", &pb.CheckResponse{Reason: pb.LeaseCheckReason_LEASE_CHECK_REASON_NAMESPACE_GONE}, nil,
			StopNamespaceGone},
		{"rolled back", &pb.CheckResponse{Reason: pb.LeaseCheckReason_LEASE_CHECK_REASON_ROLLED_BACK}, nil,
			StopNamespaceRolledBack},
		{"token", nil, status.Error(codes.PermissionDenied, "wrong token"), StopTokenRefused},
		{"no answer", nil, status.Error(codes.Unavailable, "etcd down"), 0},
		{"unknown reason", &pb.CheckResponse{Reason: 99}, nil, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := newTestClock()
			f := newFakeLease(t, clk)
			f.checkFn = func(int, *pb.CheckRequest) (*pb.CheckResponse, error) { return tc.answer, tc.err }
			g := start(t, f, testConfig(f, clk))
			clk.waitSleepers(t, 2)
			clk.advance(30 * time.Second)
			if tc.want == 0 {
				if ds := clk.waitSleepers(t, 2); ds[0] != 30*time.Second || g.Err() != nil {
					t.Fatal(ds, g.Err())
				}
				if _, err := g.NextID(context.Background()); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err := waitStopped(t, g); !errors.Is(err, &StopError{Reason: tc.want}) {
				t.Fatal(err)
			}
			if _, err := g.NextID(context.Background()); !errors.Is(err, &StopError{Reason: tc.want}) {
				t.Fatal(err)
			}
		})
	}
}

func TestShutdownDrainsThenReleasesWithTheLastTimestampPerMachineID(t *testing.T) {
	clk := newTestClock()
	f := newFakeLease(t, clk)
	f.grant = grantOf(layoutMs-10, layoutMs+600_000, 600_000, 3, 9, 12)
	cfg := testConfig(f, clk)
	cfg.MachineIDs = 3
	g := start(t, f, cfg)
	ctx := context.Background()
	clk.waitSleepers(t, 2) // the first renewal is done
	if _, err := g.NextIDFor(ctx, 0); err != nil {
		t.Fatal(err)
	}
	clk.advance(5 * time.Millisecond)
	w := g.Pin() // machine id 3 as well
	if _, err := w.NextID(ctx); err != nil {
		t.Fatal(err)
	}
	clk.advance(2 * time.Millisecond)
	if _, err := g.NextIDFor(ctx, 1); err != nil {
		t.Fatal(err)
	}
	released, err := g.Shutdown(ctx)
	rel := <-f.released
	// Machine id 12 stamped nothing: left out, it keeps its fence (as the Rust client does).
	if released != 3 || err != nil || !maps.Equal(rel.GetLastUsedMs(), map[uint32]uint64{3: layoutMs + 5, 9: layoutMs + 7}) ||
		rel.GetLeaseToken() != testToken {
		t.Fatal(released, err, rel)
	}
	if !errors.Is(g.Err(), ErrStopShutDown) {
		t.Fatal(g.Err())
	}
	for _, take := range []func(context.Context) (uint64, error){g.NextID, w.NextID} {
		if _, err := take(ctx); !errors.Is(err, ErrStopShutDown) {
			t.Fatal(err)
		}
	}
	if again, err := g.Shutdown(ctx); again != 3 || err != nil || f.counts()[3] != 1 {
		t.Fatal(again, err, f.counts())
	}
}

func TestAPIKeyTLSAndClientTimeFollowTheOptions(t *testing.T) {
	p := newPKI(t)
	clk := newTestClock()
	f := newFakeLease(t, clk, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{p.serverPair}})))
	cfg := testConfig(f, clk)
	cfg.Endpoint = "https://" + f.addr
	cfg.OmitClientTime = true
	g := start(t, f, cfg, WithAPIKey("k.s"), WithTLS(TLSConfig{CAFile: p.file("ca.pem")}))
	clk.waitSleepers(t, 2)
	if _, err := g.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	acquires, renews, _, _, _ := f.calls()
	f.mu.Lock()
	auth := slices.Clone(f.auth)
	f.mu.Unlock()
	if !slices.Equal(auth, []string{"Bearer k.s", "Bearer k.s", "Bearer k.s"}) ||
		acquires[0].ClientTimeUnixMs != nil || renews[0].ClientTimeUnixMs != nil {
		t.Fatal(auth, acquires[0], renews[0])
	}
}

func TestAConfigOutsideTheRulesIsRefusedBeforeAnyCall(t *testing.T) {
	for _, c := range []EmbeddedConfig{
		{Endpoint: "127.0.0.1:1"},
		{Endpoint: "127.0.0.1:1", Namespace: "ns", MachineIDs: 64},
		{Endpoint: "nope", Namespace: "ns"},
		{Endpoint: "127.0.0.1:1", Namespace: "ns", AcquireBackoff: time.Minute, AcquireMaxBackoff: time.Second},
	} {
		if _, err := StartEmbedded(context.Background(), c); status.Code(err) != codes.InvalidArgument {
			t.Fatal(c, err)
		}
	}
}

func TestTheRequesterIsThisProcessWithAFreshNonce(t *testing.T) {
	r := Requester{HostID: "h", PID: 1, StartUnixMs: 2, Nonce: "00"}
	if r.Tag() != "4ed3c3420511" { // the first 12 hex digits of SHA-256("h:1:2:00"), as in Rust
		t.Fatal(r.Tag())
	}
	a, b := CurrentRequester(), CurrentRequester()
	if a.HostID == "" || a.HostID != b.HostID || a.PID != b.PID || a.StartUnixMs != b.StartUnixMs ||
		a.Nonce == b.Nonce || len(a.Nonce) != 32 || a.StartUnixMs < 1_577_836_800_000 ||
		a.StartUnixMs > uint64(time.Now().UnixMilli()) {
		t.Fatal(a, b)
	}
	if c := a.WithNewNonce(); c.Nonce == a.Nonce || c.HostID != a.HostID {
		t.Fatal(c)
	}
}

func TestARenewalRaisesTheFenceTheGeneratorStampsUnder(t *testing.T) {
	clk := newTestClock()
	f := newFakeLease(t, clk)
	f.grant.MachineIds[0].FenceMs = layoutMs + 100
	gate := make(chan struct{})
	f.renewFn = func(int, *pb.RenewRequest) (*pb.LeaseGrant, error) {
		<-gate
		return grantOf(layoutMs-10, layoutMs+600_000, 172_800_000, 5), nil
	}
	cfg := testConfig(f, clk)
	cfg.CheckInterval = -1
	g := start(t, f, cfg)
	clk.advance(150 * time.Millisecond)
	var ge *GenerateError
	if _, err := g.NextID(context.Background()); !errors.As(err, &ge) || ge.Kind != ErrFenceReached ||
		ge.Fence != layoutMs+100 || g.Err() != nil {
		t.Fatal(err)
	}
	close(gate)
	clk.waitSleepers(t, 1)
	if id, err := g.NextID(context.Background()); id != uint64(layoutMs+150)<<22|5<<10 || err != nil {
		t.Fatal(id, err)
	}
}

func TestARenewalAnsweredAfterAStopNeverRestartsIssuance(t *testing.T) {
	// The checker stops (say, rolled back) while a renewal is in flight; the
	// renewal's answer then arrives: it must not publish the grant again.
	clk := newTestClock()
	e := bareGen(layoutFromPB(defaultLayout()), clk, testGrant(clk, 5))
	e.log = discardLogger
	e.stop(&StopError{Reason: StopNamespaceRolledBack})
	e.publish(grantOf(layoutMs-10, layoutMs+600_000, 600_000, 5), clk.mono())
	if _, err := e.NextID(context.Background()); !errors.Is(err, ErrStopNamespaceRolledBack) {
		t.Fatal(err)
	}
	if e.Ready() {
		t.Fatal("ready after a stop")
	}
}

func TestAClockOffsetShiftsTheWallClockOnly(t *testing.T) {
	clk := newTestClock()
	f := newFakeLease(t, clk)
	cfg := testConfig(f, clk)
	cfg.ClockOffset = 5 * time.Millisecond
	cfg.CheckInterval = -1
	g := start(t, f, cfg)
	acquires, _, _, _, _ := f.calls()
	if id, err := g.NextID(context.Background()); id != uint64(layoutMs+5)<<22|5<<10 || err != nil ||
		acquires[0].GetClientTimeUnixMs() != epoch+layoutMs+5 {
		t.Fatal(id, err, acquires[0])
	}
	// An hour ahead: past the granted fence (10 minutes ahead), refused and released.
	cfg.ClockOffset = time.Hour
	if _, err := StartEmbedded(context.Background(), cfg); !errors.Is(err, ErrGrantClockPastFence) {
		t.Fatal(err)
	}
}

func TestARenewalThatHangsIsGivenUpAtTheDeadline(t *testing.T) {
	// A stopped server: the Renew after the first hangs. With the system
	// clock and a 300 ms lease, the stop comes at the deadline, not after the
	// 10 s request timeout.
	f := newFakeLease(t, newTestClock())
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	now := uint64(time.Now().UnixMilli()) - epoch
	f.grant = grantOf(now-10, now+600_000, 600_000, 5)
	f.renewFn = func(n int, _ *pb.RenewRequest) (*pb.LeaseGrant, error) {
		if n == 1 {
			return grantOf(now-10, now+600_000, 300, 5), nil
		}
		<-hang
		return nil, status.Error(codes.Unavailable, "stopped")
	}
	cfg := testConfig(f, nil)
	cfg.clock, cfg.CheckInterval = nil, -1
	began := time.Now()
	g := start(t, f, cfg)
	err := waitStopped(t, g)
	if took := time.Since(began); !errors.Is(err, ErrStopExpired) || took > 2*time.Second {
		t.Fatal(err, took)
	}
}
