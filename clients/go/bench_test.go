package snowkeep

import (
	"context"
	"testing"
)

// BenchmarkPoolNext measures Pool.Next against the in-process fake server
// (batches of 10,000, refilled in the background).
func BenchmarkPoolNext(b *testing.B) {
	f := newFake(b, 0)
	c := mustNew(b, []string{f.url()})
	p, err := c.NewPool(WithPoolBatch(10000), WithPoolLowWater(5000))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if _, err := p.Next(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNextIDs measures one unary NextIDs(1) round trip to the fake.
func BenchmarkNextIDs(b *testing.B) {
	f := newFake(b, 0)
	c := mustNew(b, []string{f.url()})
	ctx := context.Background()
	for b.Loop() {
		if _, err := c.NextIDs(ctx, 1); err != nil {
			b.Fatal(err)
		}
	}
}
