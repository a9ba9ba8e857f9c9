package snowkeep

import (
	"context"
	"slices"
	"sync"
	"time"
)

// IdKeeper's three ways to spread N held machine ids over a process's
// callers (issue 26):
//
//   - round robin: NextID and NextIDs take the next machine id from one
//     shared counter (one atomic add per call when N > 1; none for N = 1).
//   - by key: NextIDFor(ctx, key) takes machine id key % N. IdKeeper's
//     "thread id % N"; Go has no goroutine or thread id to offer (and a
//     goroutine moves between threads), so the caller supplies the key: a
//     worker index, a shard, a connection number. Calls with different keys
//     on the same machine id still share its lock.
//   - by P: NextIDByP takes the id from a Worker kept in a sync.Pool, whose
//     per-P caches give each processor (GOMAXPROCS slot) mostly the same
//     Worker: the nearest Go has to "by thread", with no key to choose.
//   - pinned: Pin returns a *Worker, a handle for one goroutine that takes
//     ids with no shared atomic write: it reserves a run of ids of one
//     machine id under that machine id's lock (about once per tick at full
//     rate, once per window of at most 1 ms otherwise) and hands them out
//     with one monotonic-clock read and one atomic load each.

// NextID returns one id, from the held machine ids in turn (round robin),
// skipping those that cannot issue now. It waits (ctx bounds the wait) only
// when a tick's sequence is used up or the clock stepped back by at most
// MaxBackwardWait. Errors: a *GenerateError (errors.Is with ErrFenceReached
// and the other Err* kinds) while no machine id can issue, the *StopError of
// Err once the generator stopped for good, or ctx.Err().
func (e *EmbeddedGenerator) NextID(ctx context.Context) (uint64, error) {
	start := 0
	if n := len(e.machines); n > 1 {
		start = int(e.next.Add(1) % uint64(n))
	}
	return e.nextFrom(ctx, start)
}

// NextIDFor returns one id from machine id slot key % N (N held machine
// ids, in MachineIDs order): IdKeeper's "by thread" spread with a key the
// caller chooses (see the package's spreads above). When that machine id
// cannot issue now, the next ones are tried in order. Errors as NextID.
func (e *EmbeddedGenerator) NextIDFor(ctx context.Context, key uint64) (uint64, error) {
	return e.nextFrom(ctx, int(key%uint64(len(e.machines))))
}

// NextIDByP returns one id from a Worker taken from a sync.Pool and put
// back: sync.Pool keeps a cache per P (the runtime's processor slots, at
// most GOMAXPROCS), so calls running on one P mostly reuse one Worker, and
// through it one machine id, without a key or a shared atomic write. It is
// an affinity, not a guarantee: a goroutine moves between Ps, and the pool
// drops its Workers at garbage collections (a new one takes the next machine
// id in turn; sequence left in a dropped Worker's run is skipped, never
// reused), so successive calls are not ordered. Errors as NextID, from the
// Worker's machine id only.
func (e *EmbeddedGenerator) NextIDByP(ctx context.Context) (uint64, error) {
	w := e.workerPool.Get().(*Worker)
	id, err := w.NextID(ctx)
	e.workerPool.Put(w)
	return id, err
}

// nextFrom takes one id from machines[start], or, when it cannot issue now,
// from the next one that can; the first one's error when none can.
func (e *EmbeddedGenerator) nextFrom(ctx context.Context, start int) (uint64, error) {
	m := e.machines[start]
	first, count, wait, err := m.take(1)
	if count == 1 {
		return first, nil
	}
	ctx = orBackground(ctx)
	for i := 1; err != nil && i < len(e.machines); i++ {
		other := e.machines[(start+i)%len(e.machines)]
		if f, c, w, err2 := other.take(1); err2 == nil {
			m, first, count, wait, err = other, f, c, w, nil
		}
	}
	for {
		if err != nil {
			return 0, e.explain(err)
		}
		if count == 1 {
			return first, nil
		}
		if err := m.clk.sleep(ctx, wait); err != nil {
			return 0, err
		}
		first, count, wait, err = m.take(1)
	}
}

// explain returns the stop error once the generator stopped for good,
// else err.
func (e *EmbeddedGenerator) explain(err error) error {
	if s := e.stopErr.Load(); s != nil {
		return s
	}
	return err
}

// NextIDs returns n (1 to MaxCount) strictly ascending ids. A batch of up
// to one tick's sequence (2^SequenceBits) comes from one machine id, round
// robin; a larger one is spread over every machine id that can issue now,
// taken concurrently and merged in order. On an error the ids taken for the
// batch are dropped (a gap, never a reuse). Errors as NextID, and an
// INVALID_ARGUMENT *Error for n outside 1 to MaxCount.
func (e *EmbeddedGenerator) NextIDs(ctx context.Context, n int) ([]uint64, error) {
	if n < 1 || n > MaxCount {
		return nil, invalidArg("count must be 1 to %d, got %d", MaxCount, n)
	}
	ctx = orBackground(ctx)
	var ready []*machine
	if len(e.machines) > 1 && uint64(n) > e.layout.perTick() {
		for _, m := range e.machines {
			if m.ready() {
				ready = append(ready, m)
			}
		}
	}
	if len(ready) <= 1 {
		m := e.machines[0]
		if len(e.machines) > 1 {
			m = e.machines[e.next.Add(1)%uint64(len(e.machines))]
			if len(ready) == 1 {
				m = ready[0]
			}
		}
		ids, err := m.fill(ctx, uint64(n), make([]uint64, 0, n))
		if err != nil {
			return nil, e.explain(err)
		}
		return ids, nil
	}
	return e.spread(ctx, ready, n)
}

// spread takes n ids over machines concurrently and merges them.
func (e *EmbeddedGenerator) spread(ctx context.Context, machines []*machine, n int) ([]uint64, error) {
	k := len(machines)
	parts := make([][]uint64, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i, m := range machines {
		share := n/k + btoi(i < n%k)
		wg.Add(1)
		go func() {
			defer wg.Done()
			parts[i], errs[i] = m.fill(ctx, uint64(share), make([]uint64, 0, share))
		}()
	}
	wg.Wait()
	ids := make([]uint64, 0, n)
	for i := range parts {
		if errs[i] != nil {
			return nil, e.explain(errs[i])
		}
		ids = append(ids, parts[i]...)
	}
	slices.Sort(ids)
	return ids, nil
}

// orBackground is ctx, or context.Background() for a nil ctx (misuse, but
// it must not panic only when a call happens to wait).
func orBackground(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	return ctx
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Worker takes ids from one machine id for one goroutine: IdKeeper's
// "pinned per worker" spread. Get one per worker goroutine with
// EmbeddedGenerator.Pin and never share it: it is not safe for concurrent
// use (that is what makes it fast). Its ids are strictly ascending, and
// unique with every other id of the generator.
//
// How: it reserves a run of consecutive ids at one timestamp under the
// machine id's lock (every rule of the generator checked on a wall-clock
// reading), then hands them out while the run lasts, the window of that
// reading is open (at most 1 ms, and at most half the time left to the
// lease deadline, by the monotonic clock) and no renewal or stop changed the
// grant (one atomic load). An id a Worker was taking while Shutdown ran
// carries a timestamp at or below the one Shutdown released, so no later
// holder of the machine id can stamp it again.
type Worker struct {
	gen   *EmbeddedGenerator
	m     *machine
	want  uint64
	next  uint64
	end   uint64
	until time.Duration // monotonic
	epoch uint64
}

// Pin returns a Worker on the next machine id in turn: with as many
// workers as held machine ids, each worker has one machine id to itself
// (1:1); with more, workers share machine ids (still correct, they then
// share its lock).
func (e *EmbeddedGenerator) Pin() *Worker {
	i := (e.pins.Add(1) - 1) % uint64(len(e.machines))
	return &Worker{gen: e, m: e.machines[i], want: max(e.layout.perTick()/8, 1)}
}

// MachineID is the machine id the worker takes ids from.
func (w *Worker) MachineID() uint32 { return w.gen.machineIDs[w.slot()] }

func (w *Worker) slot() int { return slices.Index(w.gen.machines, w.m) }

// NextID returns one id of the worker's machine id. It waits (ctx bounds
// the wait) only when a tick's sequence is used up or the clock stepped back
// a little. Errors as EmbeddedGenerator.NextID (it does not fall back to
// another machine id).
func (w *Worker) NextID(ctx context.Context) (uint64, error) {
	if w.next < w.end && w.m.epoch.Load() == w.epoch && w.m.clk.mono() < w.until {
		id := w.next
		w.next++
		return id, nil
	}
	return w.refill(ctx)
}

func (w *Worker) refill(ctx context.Context) (uint64, error) {
	w.end = 0
	ctx = orBackground(ctx)
	for {
		first, count, wait, until, epoch, err := w.m.reserve(w.want)
		if err != nil {
			return 0, w.gen.explain(err)
		}
		if count > 0 {
			w.next, w.end, w.until, w.epoch = first+1, first+count, until, epoch
			return first, nil
		}
		if err := w.m.clk.sleep(ctx, wait); err != nil {
			return 0, err
		}
	}
}

// NextIDs returns n (1 to MaxCount) strictly ascending ids of the worker's
// machine id. Errors as NextID; on an error the ids taken are dropped.
func (w *Worker) NextIDs(ctx context.Context, n int) ([]uint64, error) {
	if n < 1 || n > MaxCount {
		return nil, invalidArg("count must be 1 to %d, got %d", MaxCount, n)
	}
	ids := make([]uint64, 0, n)
	for range n {
		id, err := w.NextID(ctx)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, nil
}
