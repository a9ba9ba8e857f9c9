// Package snowkeep is the Go client of snowkeep, a distributed service that
// hands out unique 63-bit snowflake ids over gRPC (snowkeep.v1).
//
// A Client talks to one or more servers, choosing them round-robin and
// skipping those that failed recently (ejection), retrying retryable
// failures on the next server with backoff within a retry budget:
//
//	c, err := snowkeep.New([]string{"127.0.0.1:50051"})
//	if err != nil { ... }
//	defer c.Close()
//	ids, err := c.NextIDs(ctx, 10)        // 10 ascending uint64 ids
//	s, err := c.Stream(ctx, 50000, 1000)  // exactly 50,000 ids, resumed on failover
//	p, err := c.NewPool()                 // prefetching pool: p.Next(ctx)
//	d, err := c.Decode(ctx, ids[0])       // Unix ms, machine id, sequence
//
// An EmbeddedGenerator (StartEmbedded) instead leases machine ids through a
// server's Lease API and stamps ids in this process, with no network hop per
// id, following the Lease API contract of the Rust client's
// EmbeddedGenerator (renewal, checks, stop reasons, release on Shutdown):
//
//	gen, err := snowkeep.StartEmbedded(ctx, snowkeep.EmbeddedConfig{
//		Endpoint: "127.0.0.1:50051", Namespace: "default", MachineIDs: 2})
//	if err != nil { ... }
//	defer gen.Shutdown(ctx)
//	id, err := gen.NextID(ctx)    // round robin over the held machine ids
//	w := gen.Pin()                // one per worker goroutine
//	id, err = w.NextID(ctx)       // no shared atomic write per id
//	<-gen.Stopped()               // the lease is gone: gen.Err() says why
//
// Every call takes a context.Context; cancelling it ends the call at once
// with ctx.Err(), never retried. Every other failure is an *Error carrying a
// gRPC code (codes.Code) and a message; see IsRetryableCode for the codes
// that are retried.
package snowkeep
