package snowkeep

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var retryable = []codes.Code{codes.Unavailable, codes.DeadlineExceeded, codes.Unknown,
	codes.Canceled, codes.ResourceExhausted, codes.Aborted, codes.Internal,
	codes.FailedPrecondition, codes.NotFound}

var nonRetryable = []codes.Code{codes.InvalidArgument, codes.Unauthenticated,
	codes.PermissionDenied, codes.OutOfRange, codes.Unimplemented, codes.AlreadyExists,
	codes.DataLoss}

func wantCode(t *testing.T, err error, code codes.Code, inMsg string) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want *Error %v, got %T %v", code, err, err)
	}
	if e.Code() != code || status.Code(err) != code {
		t.Fatalf("want code %v, got %v (%v)", code, e.Code(), err)
	}
	if !strings.Contains(e.Message(), inMsg) {
		t.Fatalf("want message with %q, got %q", inMsg, e.Message())
	}
	return e
}

func TestRetryableCodesAreExactlyTheNineListed(t *testing.T) {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if got, want := IsRetryableCode(c), slices.Contains(retryable, c); got != want {
			t.Errorf("%v: retryable %v, want %v", c, got, want)
		}
	}
	if CodeName(codes.Canceled) != "CANCELLED" || CodeName(codes.InvalidArgument) != "INVALID_ARGUMENT" {
		t.Fatal("code names")
	}
}

func TestNextIDsReturnsTheServersIdsWithTheKey(t *testing.T) {
	f := newFake(t, 1000)
	c := mustNew(t, []string{f.url()}, WithAPIKey("k1.secret"))
	ids, err := c.NextIDs(context.Background(), 5)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, seq(1000, 1, 5)) {
		t.Fatalf("ids %v", ids)
	}
	if !slices.Equal(f.auth, []string{"Bearer k1.secret"}) || !slices.Equal(f.counts, []uint32{5}) {
		t.Fatalf("auth %v counts %v", f.auth, f.counts)
	}
}

func TestValidationBeforeAnyCall(t *testing.T) {
	f := newFake(t, 0)
	c := mustNew(t, []string{f.addr})
	ctx := context.Background()
	for _, n := range []int{0, -1, 100001} {
		_, err := c.NextIDs(ctx, n)
		wantCode(t, err, codes.InvalidArgument, "count must be 1 to 100000")
	}
	_, err := c.Stream(ctx, 0, 10)
	wantCode(t, err, codes.InvalidArgument, "total")
	_, err = c.Stream(ctx, 10, 100001)
	wantCode(t, err, codes.InvalidArgument, "batch_size")
	_, err = c.NewPool(WithPoolBatch(0))
	wantCode(t, err, codes.InvalidArgument, "batch")
	_, err = c.NewPool(WithPoolBatch(10), WithPoolLowWater(10))
	wantCode(t, err, codes.InvalidArgument, "low_water")
	_, err = c.NewPool(WithPoolMaxAge(0))
	wantCode(t, err, codes.InvalidArgument, "max_age")
	if f.calls.Load() != 0 || f.streamCalls.Load() != 0 {
		t.Fatalf("calls made: %d %d", f.calls.Load(), f.streamCalls.Load())
	}
}

func TestBadEndpointsKeysAndFilesAreRefusedByName(t *testing.T) {
	for _, eps := range [][]string{nil, {""}, {"localhost"}, {"h:0"}, {"h:65536"},
		{"h:x"}, {"ftp://h:1"}, {":80"}, {"http://h"}, {"a:1", "b"}} {
		_, err := New(eps)
		wantCode(t, err, codes.InvalidArgument, "endpoints")
		if len(eps) > 0 && !strings.Contains(err.Error(), eps[len(eps)-1]) {
			t.Errorf("%v: message %q does not name the value", eps, err)
		}
	}
	for _, ok := range []string{"h:1", "http://h:65535", "https://127.0.0.1:443/", "[::1]:80"} {
		c, err := New([]string{ok})
		if err != nil {
			t.Fatalf("%s: %v", ok, err)
		}
		_ = c.Close()
	}
	for _, key := range []string{"a b", "tab\tkey", "ключ"} {
		_, err := New([]string{"h:1"}, WithAPIKey(key))
		wantCode(t, err, codes.InvalidArgument, "api_key")
	}
	missing := t.TempDir() + "/missing.pem"
	for name, tc := range map[string]TLSConfig{
		"tls.ca":   {CAFile: missing},
		"tls.cert": {CertFile: missing, KeyFile: missing},
		"tls.key":  {CertFile: missing},
	} {
		_, err := New([]string{"https://h:1"}, WithTLS(tc))
		wantCode(t, err, codes.InvalidArgument, name)
	}
	_, err := New([]string{"https://h:1"}, WithTLS(TLSConfig{CAFile: missing}))
	wantCode(t, err, codes.InvalidArgument, missing)
}

func TestEveryRetryableCodeMovesToTheNextServer(t *testing.T) {
	for _, code := range retryable {
		bad, good := newFake(t, 0), newFake(t, 500)
		bad.nextErr = func(int) error { return status.Error(code, "busy") }
		c := mustNew(t, []string{bad.url(), good.url()}, fastOpts...)
		ids, err := c.NextIDs(context.Background(), 3)
		if err != nil || !slices.Equal(ids, seq(500, 1, 3)) {
			t.Fatalf("%v: %v %v", code, ids, err)
		}
		if bad.calls.Load() != 1 || good.calls.Load() != 1 {
			t.Fatalf("%v: calls %d %d", code, bad.calls.Load(), good.calls.Load())
		}
	}
}

func TestEveryOtherCodeSurfacesAfterOneAttempt(t *testing.T) {
	for _, code := range nonRetryable {
		bad, good := newFake(t, 0), newFake(t, 500)
		bad.nextErr = func(int) error { return status.Error(code, "refused: "+code.String()) }
		c := mustNew(t, []string{bad.url(), good.url()}, fastOpts...)
		_, err := c.NextIDs(context.Background(), 3)
		e := wantCode(t, err, code, "refused: "+code.String())
		if e.Message() != "refused: "+code.String() || e.Retryable() {
			t.Fatalf("%v: %q", code, e.Message())
		}
		if bad.calls.Load() != 1 || good.calls.Load() != 0 {
			t.Fatalf("%v: calls %d %d", code, bad.calls.Load(), good.calls.Load())
		}
	}
}

func closedPort(t *testing.T) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	return addr
}

func TestARefusedConnectionFailsOver(t *testing.T) {
	good := newFake(t, 0)
	c := mustNew(t, []string{closedPort(t), good.addr}, fastOpts...)
	ids, err := c.NextIDs(context.Background(), 2)
	if err != nil || !slices.Equal(ids, seq(0, 1, 2)) || good.calls.Load() != 1 {
		t.Fatalf("%v %v calls %d", ids, err, good.calls.Load())
	}
}

func TestASpentBudgetFailsWithTheLastRetryableError(t *testing.T) {
	a, b := newFake(t, 0), newFake(t, 0)
	a.nextErr = func(int) error { return status.Error(codes.Unavailable, "a down") }
	b.nextErr = func(int) error { return status.Error(codes.ResourceExhausted, "b busy") }
	c := mustNew(t, []string{a.url(), b.url()},
		WithRetryBudget(150*time.Millisecond), WithBackoff(5*time.Millisecond, 20*time.Millisecond))
	start := time.Now()
	_, err := c.NextIDs(context.Background(), 1)
	took := time.Since(start)
	// Rounds go a then b; the budget may end between them, so the last error
	// is b's after a whole round, a's after a half one.
	na, nb := a.calls.Load(), b.calls.Load()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatal(err)
	}
	// The last error is the last server's: which one that is depends on
	// where the budget ended (and on a machine this loaded, an ejection can
	// send two attempts in a row to the server whose ejection ends first).
	switch {
	case e.Code() == codes.ResourceExhausted && e.Message() == "b busy":
	case e.Code() == codes.Unavailable && e.Message() == "a down":
	default:
		t.Fatalf("calls %d %d, error %v", na, nb, err)
	}
	if na-nb > 2 || nb-na > 2 {
		t.Fatalf("calls %d %d: not taking turns", na, nb)
	}
	// Several rounds, and no sleep ending past the budget.
	if nb < 3 || took > 150*time.Millisecond+100*time.Millisecond {
		t.Fatalf("calls %d %d in %v", na, nb, took)
	}
}

func TestAnAttemptTheBudgetCutsShortReportsTheFailureBeforeIt(t *testing.T) {
	a := newFake(t, 0)
	a.nextErr = func(n int) error {
		if n == 1 {
			return status.Error(codes.Unavailable, "a down")
		}
		return errStall
	}
	c := mustNew(t, []string{a.url()}, WithRequestTimeout(time.Minute),
		WithRetryBudget(300*time.Millisecond), WithBackoff(20*time.Millisecond, 20*time.Millisecond))
	_, err := c.NextIDs(context.Background(), 1)
	// The stalled retry ran out of budget, not of server time: the caller
	// learns why the server failed.
	wantCode(t, err, codes.Unavailable, "a down")
	if n := a.calls.Load(); n != 2 {
		t.Fatalf("calls %d", n)
	}
}

func TestAnEjectedServerIsSkippedUntilItsEjectionEnds(t *testing.T) {
	a, b := newFake(t, 0), newFake(t, 500)
	a.nextErr = func(n int) error {
		if n == 1 {
			return status.Error(codes.Unavailable, "restarting")
		}
		return nil
	}
	clock := newFakeClock()
	c := mustNew(t, []string{a.url(), b.url()}, WithBackoff(time.Second, 8*time.Second))
	c.bal.now = clock.now
	ctx := context.Background()
	for range 3 { // a fails and is ejected; the next two go to b, skipping a
		if _, err := c.NextIDs(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	if a.calls.Load() != 1 || b.calls.Load() != 3 {
		t.Fatalf("calls %d %d", a.calls.Load(), b.calls.Load())
	}
	clock.advance(time.Second)
	ids, err := c.NextIDs(ctx, 1) // a is back: round-robin sends it there
	if err != nil || !slices.Equal(ids, seq(0, 1, 1)) || a.calls.Load() != 2 {
		t.Fatalf("%v %v calls %d", ids, err, a.calls.Load())
	}
}

func TestWhenAllAreEjectedTheEarliestEjectionEndIsTried(t *testing.T) {
	bal := &balancer{backoff: time.Second, maxBackoff: 8 * time.Second, now: newFakeClock().now,
		servers: []*server{{}, {}, {}}}
	bal.report(0, true)
	bal.report(0, true) // 2 s
	bal.report(1, true) // 1 s
	bal.report(2, true)
	bal.report(2, true)
	bal.report(2, true) // 4 s
	if got := bal.pick(make([]bool, 3)); got != 1 {
		t.Fatalf("picked %d", got)
	}
	if d := bal.servers[2].until.Sub(bal.now()); d != 4*time.Second {
		t.Fatalf("ejection %v", d)
	}
	bal.report(2, true)
	bal.report(2, true)
	bal.report(2, true) // 32 s, capped at 8 s
	if d := bal.servers[2].until.Sub(bal.now()); d != 8*time.Second {
		t.Fatalf("ejection %v, want the 8 s cap", d)
	}
	bal.report(2, false)
	if got := bal.pick([]bool{false, true, false}); got != 2 {
		t.Fatalf("picked %d after a success cleared 2", got)
	}
}

func TestTheCallersCancellationEndsTheCallUnretried(t *testing.T) {
	slow, good := newFake(t, 0), newFake(t, 500)
	slow.block = true
	c := mustNew(t, []string{slow.url(), good.url()}, fastOpts...)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-slow.started; cancel() }()
	_, err := c.NextIDs(ctx, 1)
	if !errors.Is(err, context.Canceled) || slow.calls.Load() != 1 || good.calls.Load() != 0 {
		t.Fatalf("%v calls %d %d", err, slow.calls.Load(), good.calls.Load())
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer dcancel()
	c2 := mustNew(t, []string{slow.url()}, fastOpts...)
	if _, err := c2.NextIDs(dctx, 1); err != context.DeadlineExceeded {
		t.Fatalf("want the context's deadline, got %v", err)
	}
}

func TestAnAttemptPastRequestTimeoutMovesOn(t *testing.T) {
	slow, good := newFake(t, 0), newFake(t, 500)
	slow.block = true
	c := mustNew(t, []string{slow.url(), good.url()},
		append(fastOpts, WithRequestTimeout(100*time.Millisecond))...)
	ids, err := c.NextIDs(context.Background(), 2)
	if err != nil || !slices.Equal(ids, seq(500, 1, 2)) || slow.calls.Load() != 1 {
		t.Fatalf("%v %v calls %d", ids, err, slow.calls.Load())
	}
}

func TestCallsAfterCloseFail(t *testing.T) {
	f := newFake(t, 0)
	c := mustNew(t, []string{f.url()})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := c.NextIDs(context.Background(), 1)
	if !errors.Is(err, ErrClientClosed) {
		t.Fatal(err)
	}
	wantCode(t, err, codes.FailedPrecondition, "client closed")
	if e := (*Error)(nil); !errors.As(err, &e) || e.Retryable() {
		t.Fatalf("a closed client's error must not be retryable: %v", err)
	}
	if _, err := c.Stream(context.Background(), 1, 1); !errors.Is(err, ErrClientClosed) {
		t.Fatal(err)
	}
	if f.calls.Load() != 0 {
		t.Fatal("called")
	}
}
