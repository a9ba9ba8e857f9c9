package snowkeep

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// testGrant is machine id id with floor 10 ms below the test clock, a fence
// far above it, and a deadline a minute ahead.
func testGrant(clk *testClock, id uint32) grant {
	return grant{machineID: id, floor: layoutMs - 10, fence: layoutMs + 1_000_000, deadline: clk.mono() + time.Minute}
}

// bareGen is a generator holding ids on clk without a lease (no server):
// the spreads and the generator rules, tested alone.
func bareGen(l Layout, clk clock, grants ...grant) *EmbeddedGenerator {
	e := &EmbeddedGenerator{layout: l, clk: clk, stopped: make(chan struct{})}
	for _, g := range grants {
		m := newMachine(l, clk, DefaultMaxBackwardWait)
		m.publish(g)
		e.machines = append(e.machines, m)
		e.machineIDs = append(e.machineIDs, g.machineID)
	}
	e.workerPool.New = func() any { return e.Pin() }
	return e
}

func mustTake(t *testing.T, m *machine, want uint64) (uint64, uint64) {
	t.Helper()
	first, count, wait, err := m.take(want)
	if err != nil || wait != 0 || count == 0 {
		t.Fatalf("take(%d): %d %d %v %v", want, first, count, wait, err)
	}
	return first, count
}

func TestTheGeneratorStampsExactIDsAndCarriesTheSequenceIntoTheNextTick(t *testing.T) {
	clk := newTestClock()
	m := newMachine(layoutFromPB(defaultLayout()), clk, DefaultMaxBackwardWait)
	m.publish(testGrant(clk, 5))
	base := uint64(layoutMs)<<22 | 5<<10
	if f, n := mustTake(t, m, 1); f != base || n != 1 {
		t.Fatalf("%d %d", f, n)
	}
	if f, n := mustTake(t, m, 3); f != base+1 || n != 3 {
		t.Fatalf("%d %d", f, n)
	}
	// The next tick goes on at sequence 4, where the last one left off (below half the range).
	clk.advance(time.Millisecond)
	base = uint64(layoutMs+1)<<22 | 5<<10
	if f, _ := mustTake(t, m, 1); f != base+4 {
		t.Fatalf("%d, want %d", f, base+4)
	}
	// The tick's sequence runs out at 1024: 1019 more, then a wait of exactly the rest of the ms.
	if f, n := mustTake(t, m, 5000); f != base+5 || n != 1019 {
		t.Fatalf("%d %d", f, n)
	}
	if _, n, wait, err := m.take(1); n != 0 || wait != time.Millisecond || err != nil {
		t.Fatalf("%d %v %v", n, wait, err)
	}
	// A tick after a used-up one starts at 0.
	clk.advance(time.Millisecond)
	if f, _ := mustTake(t, m, 1); f != uint64(layoutMs+2)<<22|5<<10 {
		t.Fatalf("%d", f)
	}
	// Drain reports the last timestamp stamped.
	m.withdraw()
	if id, last, ok := m.drain(); id != 5 || last != layoutMs+2 || !ok {
		t.Fatalf("%d %d %v", id, last, ok)
	}
	if _, _, _, err := m.take(1); !errors.Is(err, ErrNoGrant) {
		t.Fatal(err)
	}
}

func TestEveryLayoutAndTimeUnitStampsTheTicksFirstMs(t *testing.T) {
	cases := []Layout{
		{TimestampBits: 41, MachineBits: 12, SequenceBits: 10, EpochUnixMs: epoch, TimeUnitMs: 1},
		{TimestampBits: 39, MachineBits: 6, SequenceBits: 8, EpochUnixMs: epoch, TimeUnitMs: 10}, // js53
		{TimestampBits: 40, MachineBits: 1, SequenceBits: 22, EpochUnixMs: epoch, TimeUnitMs: 1},
		{TimestampBits: 22, MachineBits: 2, SequenceBits: 8, EpochUnixMs: epoch, TimeUnitMs: 100},
		{TimestampBits: 35, MachineBits: 8, SequenceBits: 10, EpochUnixMs: epoch, TimeUnitMs: 1000},
	}
	for _, l := range cases {
		clk := newTestClock()
		clk.advance(7 * time.Millisecond) // layout ms 1,000,007: inside the tick starting at 1,000,000
		m := newMachine(l, clk, DefaultMaxBackwardWait)
		m.publish(grant{machineID: 1, floor: layoutMs - 1000, fence: layoutMs + 100_000, deadline: clk.mono() + time.Minute})
		first, _ := mustTake(t, m, 2)
		stamp := l.tickStart(layoutMs + 7) // 1,000,007 at 1 ms, 1,000,000 in coarser ticks
		want := stamp/l.unitMs()<<(l.MachineBits+l.SequenceBits) | 1<<l.SequenceBits
		d, err := l.Decode(first)
		if first != want || err != nil || d != (DecodedID{UnixMs: epoch + stamp, MachineID: 1}) {
			t.Fatalf("%+v: id %d want %d, %+v %v", l, first, want, d, err)
		}
		if l.Validate() != nil {
			t.Fatalf("%+v: %v", l, l.Validate())
		}
	}
	for _, bad := range []Layout{{41, 12, 11, epoch, 1}, {41, 0, 10, epoch, 1}, {10, 12, 9, epoch, 1},
		{30, 17, 10, epoch, 1}, {41, 12, 10, epoch, 5}} {
		if bad.Validate() == nil {
			t.Fatalf("%+v validated", bad)
		}
	}
}

func TestTheFloorFenceDeadlineEpochAndLayoutEndAreRefusedExactly(t *testing.T) {
	ten := Layout{TimestampBits: 39, MachineBits: 6, SequenceBits: 8, EpochUnixMs: epoch, TimeUnitMs: 10}
	check := func(name string, l Layout, g func(*testClock) grant, setup func(*testClock), want error, wantErr GenerateError) {
		t.Helper()
		clk := newTestClock()
		clk.advance(7 * time.Millisecond)
		gr := g(clk)
		if setup != nil {
			setup(clk)
		}
		m := newMachine(l, clk, DefaultMaxBackwardWait)
		m.publish(gr)
		_, _, _, err := m.take(1)
		var ge *GenerateError
		if !errors.Is(err, want) || !errors.As(err, &ge) || *ge != wantErr {
			t.Fatalf("%s: %v (%+v), want %+v", name, err, ge, wantErr)
		}
	}
	g := func(floor, fence uint64) func(*testClock) grant {
		return func(c *testClock) grant {
			return grant{machineID: 1, floor: floor, fence: fence, deadline: c.mono() + time.Minute}
		}
	}
	// A floor inside now's 10 ms tick: wait for the next tick, 1,000,010 - 1,000,007.
	check("floor", ten, g(layoutMs+3, layoutMs+100), nil, ErrClockBehindFloor,
		GenerateError{Kind: ErrClockBehindFloor, Wait: 3 * time.Millisecond})
	check("fence", ten, g(layoutMs-100, layoutMs+6), nil, ErrFenceReached,
		GenerateError{Kind: ErrFenceReached, Fence: layoutMs + 6})
	check("deadline", ten, func(c *testClock) grant {
		return grant{machineID: 1, floor: 0, fence: layoutMs + 100, deadline: c.mono()}
	}, nil, ErrLeaseExpired, GenerateError{Kind: ErrLeaseExpired})
	check("epoch", ten, g(0, layoutMs), func(c *testClock) { c.stepWall(-(layoutMs + 8) * time.Millisecond) },
		ErrClockBeforeEpoch, GenerateError{Kind: ErrClockBeforeEpoch})
	small := Layout{TimestampBits: 21, MachineBits: 1, SequenceBits: 10, EpochUnixMs: epoch, TimeUnitMs: 1}
	check("layout end", small, g(0, 1<<40), func(c *testClock) { c.stepWall(2 * time.Hour) },
		ErrLayoutExhausted, GenerateError{Kind: ErrLayoutExhausted, Fence: 1<<21 - 1})
}

func TestASmallStepBackIsWaitedOutAndALargerOneRefused(t *testing.T) {
	clk := newTestClock()
	m := newMachine(layoutFromPB(defaultLayout()), clk, DefaultMaxBackwardWait)
	m.publish(grant{machineID: 5, floor: layoutMs - 1000, fence: layoutMs + 1000, deadline: clk.mono() + time.Minute})
	mustTake(t, m, 1) // stamps 1,000,000
	// Inside the reading's window (1 ms) a wall step is not seen: same timestamp, next sequence.
	clk.stepWall(-time.Second)
	if f, _ := mustTake(t, m, 1); f != uint64(layoutMs)<<22|5<<10|1 {
		t.Fatalf("%d", f)
	}
	clk.stepWall(time.Second)
	clk.advance(time.Millisecond)
	clk.stepWall(-51 * time.Millisecond) // wall 999,950: 50 ms behind the last stamp
	if _, n, wait, err := m.take(1); n != 0 || wait != 50*time.Millisecond || err != nil {
		t.Fatalf("%d %v %v", n, wait, err)
	}
	clk.stepWall(-150 * time.Millisecond) // 200 ms behind: more than the 100 ms waited out
	_, _, _, err := m.take(1)
	var ge *GenerateError
	if !errors.As(err, &ge) || ge.Kind != ErrClockSteppedBack || ge.Wait != 200*time.Millisecond {
		t.Fatal(err)
	}
}

func TestTheWindowNeverOutlastsHalfTheTimeLeftToTheDeadline(t *testing.T) {
	clk := newTestClock()
	m := newMachine(layoutFromPB(defaultLayout()), clk, DefaultMaxBackwardWait)
	m.publish(grant{machineID: 5, floor: 0, fence: 1 << 40, deadline: clk.mono() + 600*time.Microsecond})
	mustTake(t, m, 1)
	clk.advance(299 * time.Microsecond) // inside the 300 µs window: served without a wall reading
	mustTake(t, m, 1)
	clk.advance(301 * time.Microsecond) // at the deadline
	if _, _, _, err := m.take(1); !errors.Is(err, ErrLeaseExpired) {
		t.Fatal(err)
	}
}

func TestRoundRobinByKeyAndPinnedSpreadsGiveExactIDs(t *testing.T) {
	clk := newTestClock()
	ctx := context.Background()
	e := bareGen(layoutFromPB(defaultLayout()), clk, testGrant(clk, 3), testGrant(clk, 9))
	at := func(mid, seq uint64) uint64 { return uint64(layoutMs)<<22 | mid<<10 | seq }
	var got []uint64
	for range 4 {
		id, err := e.NextID(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, id)
	}
	if !slices.Equal(got, []uint64{at(9, 0), at(3, 0), at(9, 1), at(3, 1)}) {
		t.Fatalf("round robin %v", got)
	}
	for _, c := range []struct{ key, want uint64 }{{0, at(3, 2)}, {1, at(9, 2)}, {7, at(9, 3)}} {
		if id, err := e.NextIDFor(ctx, c.key); id != c.want || err != nil {
			t.Fatalf("key %d: %d %v, want %d", c.key, id, err, c.want)
		}
	}
	// Workers take machine ids in turn; each reserves a run of 1024/8 = 128.
	w1, w2 := e.Pin(), e.Pin()
	if w1.MachineID() != 3 || w2.MachineID() != 9 {
		t.Fatal(w1.MachineID(), w2.MachineID())
	}
	for i := range uint64(3) {
		if id, err := w1.NextID(ctx); id != at(3, 3+i) || err != nil {
			t.Fatalf("worker: %d %v", id, err)
		}
	}
	if id, _ := e.NextIDFor(ctx, 0); id != at(3, 3+128) {
		t.Fatalf("after the worker's run: %d want %d", id, at(3, 131))
	}
	// By P: the pool's first Worker is the next pin in turn (the third: machine id 3 again,
	// after w1's run of 128 and the keyed id) and is reused while the pool keeps it.
	if id, err := e.NextIDByP(ctx); id != at(3, 3+128+1) || err != nil {
		t.Fatalf("by P: %d %v, want %d", id, err, at(3, 132))
	}
	// A stop reaches the worker at its next id (one atomic load), not at its run's end.
	e.machines[0].withdraw()
	if _, err := w1.NextID(ctx); !errors.Is(err, ErrNoGrant) {
		t.Fatal(err)
	}
	// Round robin and keys skip a machine id that cannot issue.
	for range 3 {
		if id, err := e.NextIDFor(ctx, 0); err != nil || id>>10&0xfff != 9 {
			t.Fatalf("%d %v", id, err)
		}
	}
}

func TestABatchLargerThanATickIsSpreadAndStrictlyAscending(t *testing.T) {
	clk := newTestClock()
	e := bareGen(layoutFromPB(defaultLayout()), clk, testGrant(clk, 3), testGrant(clk, 9))
	ids, err := e.NextIDs(context.Background(), 2048) // one tick of each machine id, no wait
	if err != nil || len(ids) != 2048 {
		t.Fatal(len(ids), err)
	}
	if ids[0] != uint64(layoutMs)<<22|3<<10 || ids[2047] != uint64(layoutMs)<<22|9<<10|1023 {
		t.Fatalf("%d %d", ids[0], ids[2047])
	}
	assertAscending(t, ids)
	// Larger: ticks are waited out (the clock advances itself on each wait).
	clk.auto = true
	ids, err = e.NextIDs(context.Background(), 5000)
	if err != nil || len(ids) != 5000 {
		t.Fatal(len(ids), err)
	}
	assertAscending(t, ids)
}

func assertAscending(t *testing.T, ids []uint64) {
	t.Helper()
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			t.Fatalf("ids[%d]=%d after %d", i, ids[i], ids[i-1])
		}
	}
}

// TestConcurrentSpreadsNeverRepeatAnID runs every spread at once on the
// system clock (with -race) and checks all ids are distinct, and ascending
// for each caller that stays on one machine id (a worker, a key; round
// robin interleaves machine ids, so its successive calls are not ordered).
func TestConcurrentSpreadsNeverRepeatAnID(t *testing.T) {
	now := time.Now()
	nowMs := uint64(now.UnixMilli()) - epoch
	mono := systemClock{}.mono()
	g := func(id uint32) grant {
		return grant{machineID: id, floor: nowMs - 1, fence: nowMs + 600_000, deadline: mono + 10*time.Minute}
	}
	e := bareGen(layoutFromPB(defaultLayout()), systemClock{}, g(1), g(2))
	ctx := context.Background()
	w1, w2 := e.Pin(), e.Pin()
	takers := []func() (uint64, error){
		func() (uint64, error) { return w1.NextID(ctx) },
		func() (uint64, error) { return w2.NextID(ctx) },
		func() (uint64, error) { return e.NextID(ctx) },
		func() (uint64, error) { return e.NextIDFor(ctx, 1) },
		func() (uint64, error) { return e.NextIDByP(ctx) },
		func() (uint64, error) { return e.NextIDByP(ctx) },
	}
	results := make([][]uint64, len(takers))
	var wg sync.WaitGroup
	for i, take := range takers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5000 {
				id, err := take()
				if err != nil {
					t.Error(err)
					return
				}
				results[i] = append(results[i], id)
			}
		}()
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for i, r := range results {
		if i != 2 && i < 4 { // round robin and by-P calls may change machine id call to call
			assertAscending(t, r)
		}
		for _, id := range r {
			if seen[id] {
				t.Fatalf("id %d issued twice", id)
			}
			seen[id] = true
		}
	}
	if len(seen) != 30000 {
		t.Fatal(len(seen))
	}
}
