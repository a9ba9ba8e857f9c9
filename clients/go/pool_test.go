package snowkeep

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func take(t *testing.T, p *Pool, n int) []uint64 {
	t.Helper()
	var ids []uint64
	for range n {
		id, err := p.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func TestAPoolHandsOutTheFetchedIdsInBatches(t *testing.T) {
	f := newFake(t, 0)
	c := mustNew(t, []string{f.url()})
	p, err := c.NewPool(WithPoolBatch(10), WithPoolLowWater(2))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if ids := take(t, p, 25); !slices.Equal(ids, seq(0, 1, 25)) {
		t.Fatalf("ids %v", ids)
	}
	p.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.counts) < 3 || slices.ContainsFunc(f.counts, func(n uint32) bool { return n != 10 }) {
		t.Fatalf("counts %v", f.counts)
	}
}

func TestAPoolDropsIdsPastMaxAge(t *testing.T) {
	f := newFake(t, 0)
	c := mustNew(t, []string{f.url()})
	clock := newFakeClock()
	c.bal.now = clock.now
	p, _ := c.NewPool(WithPoolBatch(10), WithPoolLowWater(0), WithPoolMaxAge(time.Minute))
	defer p.Close()
	if ids := take(t, p, 1); !slices.Equal(ids, []uint64{1}) {
		t.Fatal(ids)
	}
	clock.advance(time.Minute)
	// ids 2..10 are a minute old now: dropped; the next batch is 11..20.
	if ids := take(t, p, 2); !slices.Equal(ids, []uint64{11, 12}) {
		t.Fatalf("ids %v", ids)
	}
}

func TestAPoolFailsWithTheRefillsLastError(t *testing.T) {
	f := newFake(t, 0)
	f.nextErr = func(int) error { return status.Error(codes.Unavailable, "no lease") }
	c := mustNew(t, []string{f.url()}, WithRetryBudget(50*time.Millisecond),
		WithBackoff(2*time.Millisecond, 5*time.Millisecond))
	p, _ := c.NewPool()
	defer p.Close()
	_, err := p.Next(context.Background())
	wantCode(t, err, codes.Unavailable, "no lease")

	g := newFake(t, 0)
	g.nextErr = func(int) error { return status.Error(codes.PermissionDenied, "no ids permission") }
	c2 := mustNew(t, []string{g.url()})
	p2, _ := c2.NewPool()
	defer p2.Close()
	_, err = p2.Next(context.Background())
	wantCode(t, err, codes.PermissionDenied, "no ids permission")
}

func TestAClosedPoolSaysSo(t *testing.T) {
	f := newFake(t, 0)
	c := mustNew(t, []string{f.url()})
	p, _ := c.NewPool(WithPoolBatch(5))
	take(t, p, 1)
	p.Close()
	p.Close()
	_, err := p.Next(context.Background())
	if !errors.Is(err, ErrPoolClosed) {
		t.Fatal(err)
	}
	wantCode(t, err, codes.FailedPrecondition, "pool closed")
	if e := (*Error)(nil); !errors.As(err, &e) || e.Retryable() {
		t.Fatalf("a closed pool's error must not be retryable: %v", err)
	}
}

func TestAPoolWaitEndsWithTheCallersContext(t *testing.T) {
	f := newFake(t, 0)
	f.block = true
	c := mustNew(t, []string{f.url()})
	p, _ := c.NewPool()
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-f.started; cancel() }()
	if _, err := p.Next(ctx); err != context.Canceled {
		t.Fatal(err)
	}
	if f.calls.Load() != 1 {
		t.Fatalf("at most one refill in flight: %d", f.calls.Load())
	}
}
