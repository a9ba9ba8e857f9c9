package snowkeep

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// drain reads s to its end: the batch sizes, all ids and the final error
// (nil at io.EOF).
func drain(t *testing.T, s *Stream) ([]int, []uint64, error) {
	t.Helper()
	var sizes []int
	var all []uint64
	for {
		ids, err := s.Recv()
		if err == io.EOF {
			return sizes, all, nil
		}
		if err != nil {
			return sizes, all, err
		}
		sizes = append(sizes, len(ids))
		all = append(all, ids...)
	}
}

func TestAStreamDeliversExactlyTotal(t *testing.T) {
	f := newFake(t, 0)
	c := mustNew(t, []string{f.url()})
	s, err := c.Stream(context.Background(), 2500, 1000)
	if err != nil {
		t.Fatal(err)
	}
	sizes, ids, err := drain(t, s)
	if err != nil || !slices.Equal(sizes, []int{1000, 1000, 500}) || !slices.Equal(ids, seq(0, 1, 2500)) {
		t.Fatalf("%v %d %v", sizes, len(ids), err)
	}
	if s.Received() != 2500 || !slices.Equal(f.totals, []uint64{2500}) {
		t.Fatalf("received %d totals %v", s.Received(), f.totals)
	}
	if _, err := s.Recv(); err != io.EOF {
		t.Fatal(err)
	}
}

func TestAStreamEndedRetryablyResumesOnTheNextServerForTheRest(t *testing.T) {
	a, b := newFake(t, 0), newFake(t, 1_000_000)
	a.streamPlan = func(int) (int, error) {
		return 3, status.Error(codes.Unavailable, "stream ended early: 300 of 1000 ids sent; this server is shutting down")
	}
	c := mustNew(t, []string{a.url(), b.url()}, fastOpts...)
	s, err := c.Stream(context.Background(), 1000, 100)
	if err != nil {
		t.Fatal(err)
	}
	sizes, ids, err := drain(t, s)
	if err != nil || len(sizes) != 10 {
		t.Fatalf("%v %v", sizes, err)
	}
	want := append(seq(0, 1, 300), seq(1_000_000, 1, 700)...)
	if !slices.Equal(ids, want) {
		t.Fatalf("ids differ: %d", len(ids))
	}
	if !slices.Equal(a.totals, []uint64{1000}) || !slices.Equal(b.totals, []uint64{700}) {
		t.Fatalf("totals %v %v", a.totals, b.totals)
	}
}

func TestAStreamEndedNonRetryablySurfacesAfterItsBatches(t *testing.T) {
	a, b := newFake(t, 0), newFake(t, 1_000_000)
	a.streamPlan = func(int) (int, error) {
		return 2, status.Error(codes.PermissionDenied, "key revoked")
	}
	c := mustNew(t, []string{a.url(), b.url()}, fastOpts...)
	s, _ := c.Stream(context.Background(), 1000, 100)
	sizes, ids, err := drain(t, s)
	wantCode(t, err, codes.PermissionDenied, "key revoked")
	if !slices.Equal(sizes, []int{100, 100}) || !slices.Equal(ids, seq(0, 1, 200)) || b.streamCalls.Load() != 0 {
		t.Fatalf("%v %d b calls %d", sizes, len(ids), b.streamCalls.Load())
	}
	if _, again := s.Recv(); again != err {
		t.Fatal("error not sticky")
	}
}

func TestAStreamWhoseServersKeepFailingSpendsItsBudget(t *testing.T) {
	a := newFake(t, 0)
	a.streamPlan = func(n int) (int, error) {
		if n == 1 {
			return 1, status.Error(codes.Unavailable, "lease lost")
		}
		return 0, status.Error(codes.Unavailable, "no lease")
	}
	c := mustNew(t, []string{a.url()}, WithRetryBudget(100*time.Millisecond),
		WithBackoff(2*time.Millisecond, 10*time.Millisecond))
	s, _ := c.Stream(context.Background(), 50, 10)
	sizes, _, err := drain(t, s)
	wantCode(t, err, codes.Unavailable, "no lease")
	if !slices.Equal(sizes, []int{10}) || a.streamCalls.Load() < 3 || s.Received() != 10 {
		t.Fatalf("%v calls %d", sizes, a.streamCalls.Load())
	}
	// An attempt the budget cut short may still be recording: read under the lock.
	a.mu.Lock()
	totals := slices.Clone(a.totals)
	a.mu.Unlock()
	if !slices.Equal(totals[:2], []uint64{50, 40}) {
		t.Fatalf("totals %v", totals)
	}
}

func TestAResumeTheBudgetCutsShortReportsThePartsEnd(t *testing.T) {
	a := newFake(t, 0)
	a.streamPlan = func(n int) (int, error) {
		if n == 1 {
			return 1, status.Error(codes.Unavailable, "lease lost")
		}
		return 0, errStall
	}
	c := mustNew(t, []string{a.url()}, WithRequestTimeout(time.Minute),
		WithRetryBudget(300*time.Millisecond), WithBackoff(20*time.Millisecond, 20*time.Millisecond))
	s, _ := c.Stream(context.Background(), 50, 10)
	sizes, _, err := drain(t, s)
	wantCode(t, err, codes.Unavailable, "lease lost")
	if !slices.Equal(sizes, []int{10}) || a.streamCalls.Load() != 2 {
		t.Fatalf("%v calls %d", sizes, a.streamCalls.Load())
	}
}

func TestABatchForgetsTheFailuresBeforeIt(t *testing.T) {
	a := newFake(t, 0)
	a.streamPlan = func(n int) (int, error) {
		if n == 1 {
			return 0, status.Error(codes.Unavailable, "a down")
		}
		return 1, errStall
	}
	c := mustNew(t, []string{a.url()}, WithRequestTimeout(time.Minute),
		WithRetryBudget(300*time.Millisecond), WithBackoff(20*time.Millisecond, 20*time.Millisecond))
	s, _ := c.Stream(context.Background(), 50, 10)
	sizes, _, err := drain(t, s)
	// The second part healed the first's failure with a batch, then stalled
	// past the budget that batch restarted: the stall is what is reported.
	wantCode(t, err, codes.DeadlineExceeded, "no batch within the request timeout")
	if !slices.Equal(sizes, []int{10}) || a.streamCalls.Load() != 2 {
		t.Fatalf("%v calls %d", sizes, a.streamCalls.Load())
	}
}

func TestAnOKEndBeforeTotalIsResumed(t *testing.T) {
	a := newFake(t, 0)
	a.streamPlan = func(n int) (int, error) {
		if n == 1 {
			return 2, nil // an older server: OK after 2 batches
		}
		return -1, nil
	}
	c := mustNew(t, []string{a.url()}, fastOpts...)
	s, _ := c.Stream(context.Background(), 45, 10)
	var all []uint64
	for ids, err := range s.All() {
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, ids...)
	}
	if !slices.Equal(all, seq(0, 1, 45)) || !slices.Equal(a.totals, []uint64{45, 25}) {
		t.Fatalf("%d ids totals %v", len(all), a.totals)
	}
}

func TestClosingAStreamEndsItWithCancellation(t *testing.T) {
	f := newFake(t, 0)
	c := mustNew(t, []string{f.url()})
	ctx, cancel := context.WithCancel(context.Background())
	s, _ := c.Stream(ctx, 1<<40, 1000)
	if ids, err := s.Recv(); err != nil || len(ids) != 1000 {
		t.Fatal(err)
	}
	cancel()
	var err error
	for err == nil {
		_, err = s.Recv()
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled, got %v", err)
	}
	s.Close()
}

func TestAStalledStreamIsResumedAfterTheRequestTimeout(t *testing.T) {
	a, b := newFake(t, 0), newFake(t, 1_000_000)
	a.streamPlan = func(int) (int, error) { return 2, errStall }
	c := mustNew(t, []string{a.url(), b.url()},
		append(fastOpts, WithRequestTimeout(100*time.Millisecond))...)
	s, _ := c.Stream(context.Background(), 50, 10)
	sizes, ids, err := drain(t, s)
	if err != nil || !slices.Equal(sizes, []int{10, 10, 10, 10, 10}) {
		t.Fatalf("%v %v", sizes, err)
	}
	if !slices.Equal(ids, append(seq(0, 1, 20), seq(1_000_000, 1, 30)...)) || !slices.Equal(b.totals, []uint64{30}) {
		t.Fatalf("%v totals %v", ids, b.totals)
	}
}
