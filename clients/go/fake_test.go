package snowkeep

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	pb "example.invalid/snowkeep/clients/go/gen/snowkeepv1"
)

// fake is an in-process double of a snowkeep server (IdService and
// InfoService) on a loopback port. Its ids are base+1, base+2, ...: unique
// across fakes with different bases, ascending within one.
type fake struct {
	pb.UnimplementedIdServiceServer
	pb.UnimplementedInfoServiceServer

	addr string
	srv  *grpc.Server
	base uint64

	mu      sync.Mutex
	counter uint64
	auth    []string
	counts  []uint32 // NextIds counts asked
	totals  []uint64 // StreamIds totals asked

	calls       atomic.Int32
	streamCalls atomic.Int32
	infoCalls   atomic.Int32

	// nextErr, when set, decides the answer of the n-th NextIds call (1-based);
	// errStall makes that call wait until its context ends.
	nextErr func(n int) error
	// block makes NextIds wait until its context ends; started gets a value
	// when a blocked call arrived.
	block   bool
	started chan struct{}
	// streamPlan, when set, decides for the n-th StreamIds call how many
	// batches to send (-1: all) and the error to end with after them.
	streamPlan func(n int) (int, error)
	layout     *pb.Layout
}

func newFake(t testing.TB, base uint64, opts ...grpc.ServerOption) *fake {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fake{addr: lis.Addr().String(), srv: grpc.NewServer(opts...), base: base,
		started: make(chan struct{}, 16)}
	pb.RegisterIdServiceServer(f.srv, f)
	pb.RegisterInfoServiceServer(f.srv, f)
	go func() { _ = f.srv.Serve(lis) }()
	t.Cleanup(f.srv.Stop)
	return f
}

func newTLSFake(t testing.TB, base uint64, c credentials.TransportCredentials) *fake {
	return newFake(t, base, grpc.Creds(c))
}

func (f *fake) url() string { return "http://" + f.addr }

func (f *fake) take(n uint64) []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make([]uint64, n)
	for i := range ids {
		f.counter++
		ids[i] = f.base + f.counter
	}
	return ids
}

func (f *fake) record(ctx context.Context) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.mu.Lock()
	f.auth = append(f.auth, md.Get("authorization")...)
	f.mu.Unlock()
}

func (f *fake) NextIds(ctx context.Context, r *pb.NextIdsRequest) (*pb.NextIdsResponse, error) {
	n := int(f.calls.Add(1))
	f.record(ctx)
	f.mu.Lock()
	f.counts = append(f.counts, r.GetCount())
	f.mu.Unlock()
	if f.block {
		f.started <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if f.nextErr != nil {
		if err := f.nextErr(n); err == errStall {
			<-ctx.Done()
			return nil, ctx.Err()
		} else if err != nil {
			return nil, err
		}
	}
	return &pb.NextIdsResponse{Ids: f.take(uint64(r.GetCount()))}, nil
}

func (f *fake) StreamIds(r *pb.StreamIdsRequest, s grpc.ServerStreamingServer[pb.IdBatch]) error {
	n := int(f.streamCalls.Add(1))
	f.record(s.Context())
	f.mu.Lock()
	f.totals = append(f.totals, r.GetTotal())
	f.mu.Unlock()
	limit, end := -1, error(nil)
	if f.streamPlan != nil {
		limit, end = f.streamPlan(n)
	}
	bs := uint64(r.GetBatchSize())
	if bs == 0 {
		bs = 1000
	}
	for sent, batches := uint64(0), 0; sent < r.GetTotal(); batches++ {
		if batches == limit {
			if end == errStall {
				<-s.Context().Done()
				return s.Context().Err()
			}
			return end
		}
		k := min(bs, r.GetTotal()-sent)
		if err := s.Send(&pb.IdBatch{Ids: f.take(k)}); err != nil {
			return err
		}
		sent += k
	}
	return nil
}

func (f *fake) GetInfo(context.Context, *pb.GetInfoRequest) (*pb.GetInfoResponse, error) {
	f.infoCalls.Add(1)
	return &pb.GetInfoResponse{Version: "test", Layout: f.layout}, nil
}

// errStall as a streamPlan's end makes the stream stall (send nothing more)
// until the client gives up on it.
var errStall = errors.New("stall")

// fakeClock is a settable clock for ejection and pool max age.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// seq is the ids base+from .. base+to.
func seq(base, from, to uint64) []uint64 {
	var ids []uint64
	for i := from; i <= to; i++ {
		ids = append(ids, base+i)
	}
	return ids
}

// fastOpts keeps retries quick in tests.
var fastOpts = []Option{WithBackoff(time.Millisecond, 4*time.Millisecond)}

func mustNew(t testing.TB, eps []string, opts ...Option) *Client {
	t.Helper()
	c, err := New(eps, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
