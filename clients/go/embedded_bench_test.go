package snowkeep

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sony/sonyflake"
)

// The hot path of the embedded generator beside Go peers, in one run:
//
//	go test -run '^$' -bench 'NextID/' -benchtime 2s -count 3 .
//
// The generator runs on layout 40/1/22 (22 sequence bits: 4,194,304 ids per
// ms per machine id, so one caller never uses a tick up and the figure is
// the per-id cost, not the layout's limit), as the Rust criterion bench
// does, on the system clock, with every per-id rule kept. Peers:
//
//   - sonyflake_v1: github.com/sony/sonyflake v1.2.0, the well-known Go
//     snowflake. Its bits are fixed (39/16/8 in 10 ms ticks: 25,600 ids/s),
//     so a tight loop measures its limit (about 39 µs per id: it sleeps with
//     its mutex held once 256 ids of a tick are taken), not its per-id cost.
//   - mutex_snowflake: sonyflake's NextID code (a mutex, one time.Now per
//     id) on the same 40/1/22 bits in 1 ms ticks: the unsaturated peer the
//     ratios are taken against.

// benchLayout is 40/1/22 in 1 ms units from the default epoch.
var benchLayout = Layout{TimestampBits: 40, MachineBits: 1, SequenceBits: 22, EpochUnixMs: epoch, TimeUnitMs: 1}

// benchGen holds machine ids 0 and 1 (n of them) on the system clock, with
// an hour of fence and lease.
func benchGen(n int) *EmbeddedGenerator {
	nowMs := uint64(time.Now().UnixMilli()) - epoch
	mono := systemClock{}.mono()
	var grants []grant
	for i := range n {
		grants = append(grants, grant{machineID: uint32(i), floor: nowMs - 1, fence: nowMs + 3_600_000,
			deadline: mono + time.Hour})
	}
	return bareGen(benchLayout, systemClock{}, grants...)
}

// mutexSnowflake is sonyflake v1's NextID on 40/1/22 bits in 1 ms ticks.
type mutexSnowflake struct {
	mu       sync.Mutex
	start    time.Time
	elapsed  int64
	sequence uint64
}

func (s *mutexSnowflake) NextID() (uint64, error) {
	const mask = 1<<22 - 1
	s.mu.Lock()
	defer s.mu.Unlock()
	current := time.Since(s.start).Milliseconds()
	if s.elapsed < current {
		s.elapsed, s.sequence = current, 0
	} else {
		s.sequence = (s.sequence + 1) & mask
		if s.sequence == 0 {
			s.elapsed++
			time.Sleep(time.Duration(s.elapsed-current) * time.Millisecond)
		}
	}
	return uint64(s.elapsed)<<23 | 1<<22 | s.sequence, nil
}

func BenchmarkNextID(b *testing.B) {
	ctx := context.Background()
	run := func(b *testing.B, next func() (uint64, error)) {
		var last uint64
		for b.Loop() {
			id, err := next()
			if err != nil || id <= last {
				b.Fatal(id, last, err)
			}
			last = id
		}
	}
	b.Run("round_robin_1", func(b *testing.B) {
		g := benchGen(1)
		run(b, func() (uint64, error) { return g.NextID(ctx) })
	})
	b.Run("round_robin_2", func(b *testing.B) {
		g := benchGen(2)
		var last uint64
		for b.Loop() { // ids alternate machine ids: not ascending call to call
			id, err := g.NextID(ctx)
			if err != nil || id == last {
				b.Fatal(id, err)
			}
			last = id
		}
	})
	b.Run("by_key", func(b *testing.B) {
		g := benchGen(2)
		run(b, func() (uint64, error) { return g.NextIDFor(ctx, 1) })
	})
	b.Run("by_p", func(b *testing.B) {
		g := benchGen(2)
		var last uint64
		for b.Loop() { // a GC may hand a new Worker (the next machine id): not ascending
			id, err := g.NextIDByP(ctx)
			if err != nil || id == last {
				b.Fatal(id, err)
			}
			last = id
		}
	})
	b.Run("pinned", func(b *testing.B) {
		w := benchGen(2).Pin()
		run(b, func() (uint64, error) { return w.NextID(ctx) })
	})
	b.Run("mutex_snowflake", func(b *testing.B) {
		s := &mutexSnowflake{start: time.Now()}
		run(b, s.NextID)
	})
	b.Run("sonyflake_v1", func(b *testing.B) {
		s, err := sonyflake.New(sonyflake.Settings{MachineID: func() (uint16, error) { return 1, nil }})
		if err != nil {
			b.Fatal(err)
		}
		run(b, s.NextID)
	})
}

// BenchmarkNextIDParallel: GOMAXPROCS goroutines at once, each pinned to
// its own machine id (pinned) or all sharing the generator's round robin.
func BenchmarkNextIDParallel(b *testing.B) {
	ctx := context.Background()
	b.Run("round_robin_2", func(b *testing.B) {
		g := benchGen(2)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := g.NextID(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("pinned_2", func(b *testing.B) {
		g := benchGen(2)
		b.RunParallel(func(pb *testing.PB) {
			w := g.Pin()
			for pb.Next() {
				if _, err := w.NextID(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("by_p_2", func(b *testing.B) {
		g := benchGen(2)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := g.NextIDByP(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("mutex_snowflake", func(b *testing.B) {
		s := &mutexSnowflake{start: time.Now()}
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := s.NextID(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
