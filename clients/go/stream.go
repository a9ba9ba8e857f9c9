package snowkeep

import (
	"context"
	"io"
	"iter"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	pb "example.invalid/snowkeep/clients/go/gen/snowkeepv1"
)

// Stream delivers exactly the total ids asked for, in batches, resuming on
// the next endpoint when a server's stream ends early with a retryable code.
// Every id is unique; ids ascend within each server's part of the stream (a
// resumed part may start below the previous part's last id, since it comes
// from another machine id). Use Recv (or All) from one goroutine; Close may
// be called from any.
type Stream struct {
	c         *Client
	ctx       context.Context
	cancel    context.CancelFunc
	total     uint64
	batchSize uint32
	received  uint64
	r         *retrier

	cur      grpc.ServerStreamingClient[pb.IdBatch]
	curIdx   int
	curEnd   context.CancelFunc
	timedOut *atomic.Bool
	err      error
}

// Stream opens a stream of exactly total ids (1 to 2^63-1) in batches of
// batchSize ids (1 to MaxCount; 0 means the server's default, 1000). Opening
// and every resume follow the retry rule; the retry budget restarts whenever
// a batch arrives. The first attempt is made by the first Recv. Arguments
// out of range fail at once with an INVALID_ARGUMENT *Error naming total or
// batch_size. Close the stream (or read it to the end) to release it.
func (c *Client) Stream(ctx context.Context, total uint64, batchSize int) (*Stream, error) {
	if total < 1 || total > 1<<63-1 {
		return nil, invalidArg("total must be 1 to %d, got %d", uint64(1<<63-1), total)
	}
	if batchSize < 0 || batchSize > MaxCount {
		return nil, invalidArg("batch_size must be 0 to %d, got %d", MaxCount, batchSize)
	}
	if c.isClosed() {
		return nil, ErrClientClosed
	}
	sctx, cancel := context.WithCancel(ctx)
	return &Stream{c: c, ctx: sctx, cancel: cancel, total: total,
		batchSize: uint32(batchSize), r: c.newRetrier()}, nil
}

// Received is the number of ids delivered so far.
func (s *Stream) Received() uint64 { return s.received }

// Recv returns the next batch: strictly ascending ids, never more in all
// than the total. After the last batch it returns io.EOF. A non-retryable
// end, or a spent retry budget, returns the *Error after the batches already
// delivered; the caller's cancellation returns ctx.Err(). Once Recv has
// returned an error it returns the same error again.
func (s *Stream) Recv() ([]uint64, error) {
	if s.err != nil {
		return nil, s.err
	}
	ids, err := s.recv()
	if err != nil {
		s.err = err
		s.release()
		s.cancel()
	}
	return ids, err
}

func (s *Stream) recv() ([]uint64, error) {
	if s.received == s.total {
		return nil, io.EOF
	}
	for {
		if s.cur == nil {
			if err := s.open(); err != nil {
				return nil, err
			}
		}
		// The part's cancel func, read here: the timer's goroutine must not
		// read s.curEnd, which release() clears on this goroutine.
		end := s.curEnd
		timer := time.AfterFunc(s.r.wait(), func() {
			s.timedOut.Store(true)
			end()
		})
		b, err := s.cur.Recv()
		timer.Stop()
		if err == nil && len(b.GetIds()) > 0 {
			ids := b.GetIds()
			if left := s.total - s.received; uint64(len(ids)) > left {
				ids = ids[:left]
			}
			s.received += uint64(len(ids))
			s.r.restart()
			s.c.bal.report(s.curIdx, false)
			if s.received == s.total {
				s.release()
			}
			return ids, nil
		}
		if err == nil {
			continue
		}
		if err == io.EOF {
			err = &Error{code: codes.Unavailable, msg: "the server ended the stream with OK before every id was sent"}
		} else if s.timedOut.Load() && s.ctx.Err() == nil {
			err = &Error{code: codes.DeadlineExceeded, msg: "no batch within the request timeout"}
		}
		idx := s.curIdx
		s.release()
		if err := s.r.failed(s.ctx, idx, err); err != nil {
			return nil, err
		}
	}
}

// open starts a StreamIds call for the ids still owed on the next server.
func (s *Stream) open() error {
	for {
		i, _, err := s.r.next(s.ctx)
		if err != nil {
			return err
		}
		actx, cancel := context.WithCancel(s.ctx)
		req := &pb.StreamIdsRequest{Total: s.total - s.received, BatchSize: s.batchSize}
		st, err := s.c.bal.servers[i].ids.StreamIds(actx, req)
		if err == nil {
			s.cur, s.curIdx, s.curEnd, s.timedOut = st, i, cancel, new(atomic.Bool)
			return nil
		}
		cancel()
		if err := s.r.failed(s.ctx, i, err); err != nil {
			return err
		}
	}
}

func (s *Stream) release() {
	if s.curEnd != nil {
		s.curEnd()
	}
	s.cur, s.curEnd = nil, nil
}

// Close ends the stream and its call; Recv then returns ctx.Err()
// (context.Canceled) unless it already ended. Close is idempotent.
func (s *Stream) Close() { s.cancel() }

// All returns the stream as an iterator of batches; the last pair holds a
// non-nil error when the stream fails (never io.EOF: the iteration just
// ends). Breaking out of the loop closes the stream.
func (s *Stream) All() iter.Seq2[[]uint64, error] {
	return func(yield func([]uint64, error) bool) {
		defer s.Close()
		for {
			ids, err := s.Recv()
			if err == io.EOF {
				return
			}
			if !yield(ids, err) || err != nil {
				return
			}
		}
	}
}
