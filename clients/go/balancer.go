package snowkeep

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	pb "example.invalid/snowkeep/clients/go/gen/snowkeepv1"
)

// server is one endpoint with its lazy connection and ejection state.
type server struct {
	ep    endpoint
	conn  *grpc.ClientConn
	ids   pb.IdServiceClient
	info  pb.InfoServiceClient
	fails int       // consecutive retryable failures
	until time.Time // ejected until then
}

// balancer chooses servers round-robin, skipping ejected ones.
type balancer struct {
	mu         sync.Mutex
	servers    []*server
	next       int
	backoff    time.Duration
	maxBackoff time.Duration
	now        func() time.Time
}

// pick returns the index of the next server to try among those not in
// tried: the next one in round-robin order that is not ejected, or, when
// every candidate is ejected, the one whose ejection ends first. It returns
// -1 when every server has been tried.
func (b *balancer) pick(tried []bool) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	n := len(b.servers)
	best := -1
	for k := range n {
		i := (b.next + k) % n
		if tried[i] {
			continue
		}
		s := b.servers[i]
		if !s.until.After(now) {
			best = i
			break
		}
		if best < 0 || s.until.Before(b.servers[best].until) {
			best = i
		}
	}
	if best >= 0 {
		b.next = (best + 1) % n
	}
	return best
}

// report records an attempt's outcome on server i: a retryable failure
// ejects it for backoff doubling per consecutive failure up to maxBackoff;
// anything else clears its ejection.
func (b *balancer) report(i int, retryable bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.servers[i]
	if !retryable {
		s.fails, s.until = 0, time.Time{}
		return
	}
	s.fails++
	d := b.backoff
	for k := 1; k < s.fails && d < b.maxBackoff; k++ {
		d *= 2
	}
	s.until = b.now().Add(min(d, b.maxBackoff))
}

// retrier walks the retry rule for one call: rounds over every server,
// a jittered doubling sleep after each full round, and the overall budget.
type retrier struct {
	c        *Client
	tried    []bool
	left     int
	sleep    time.Duration
	deadline time.Time
	last     *Error
	cut      bool // the last attempt's deadline was the budget's end
}

func (c *Client) newRetrier() *retrier {
	r := &retrier{c: c, tried: make([]bool, len(c.bal.servers))}
	r.restart()
	return r
}

// restart begins a fresh budget, round and backoff (a stream does it when a
// batch arrives). The failures before it are forgotten: the batch shows they
// healed, so a spent budget later reports only what failed after it.
func (r *retrier) restart() {
	clear(r.tried)
	r.left = len(r.tried)
	r.sleep = r.c.cfg.backoff
	r.deadline = time.Now().Add(r.c.cfg.retryBudget)
	r.last = nil
	r.cut = false
}

// wait returns how long the next wait of an attempt in progress may last
// (a stream's wait for its next batch): the smaller of the request timeout
// and the budget left, noting whether the budget was the smaller.
func (r *retrier) wait() time.Duration {
	left := time.Until(r.deadline)
	r.cut = left < r.c.cfg.requestTimeout
	return max(min(r.c.cfg.requestTimeout, left), 0)
}

// next waits as the rule says and returns the server for the next attempt
// and that attempt's timeout. It fails with the last retryable error once the
// budget is spent, and with ctx.Err() when ctx ends first.
func (r *retrier) next(ctx context.Context) (int, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	if r.left == 0 {
		d := time.Duration(float64(r.sleep) * (0.8 + 0.4*rand.Float64()))
		if time.Now().Add(d).After(r.deadline) {
			return 0, 0, r.spent()
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, 0, ctx.Err()
		case <-t.C:
		}
		r.sleep = min(2*r.sleep, r.c.cfg.maxBackoff)
		clear(r.tried)
		r.left = len(r.tried)
	}
	left := time.Until(r.deadline)
	if left <= 0 {
		return 0, 0, r.spent()
	}
	i := r.c.bal.pick(r.tried)
	r.tried[i] = true
	r.left--
	r.cut = left < r.c.cfg.requestTimeout
	return i, min(r.c.cfg.requestTimeout, left), nil
}

func (r *retrier) spent() error {
	if r.last != nil {
		return r.last
	}
	return &Error{code: codes.DeadlineExceeded, msg: "retry budget spent before any attempt"}
}

// failed classifies an attempt's error on server i. It returns the error to
// surface now (ctx.Err() for the caller's own cancellation, the typed error
// for a non-retryable code, ErrClientClosed), or nil to retry.
func (r *retrier) failed(ctx context.Context, i int, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if r.c.isClosed() {
		return ErrClientClosed
	}
	e := fromRPC(err)
	if errors.Is(err, context.DeadlineExceeded) || e.code == codes.DeadlineExceeded {
		e = &Error{code: codes.DeadlineExceeded, msg: e.msg}
	}
	retry := IsRetryableCode(e.code)
	r.c.bal.report(i, retry)
	if !retry {
		return e
	}
	// An attempt cut short by the budget's end says less than the failure
	// before it: keep that one as the error to surface.
	if !(r.cut && e.code == codes.DeadlineExceeded && r.last != nil) {
		r.last = e
	}
	return nil
}

// call runs one unary attempt function under the retry rule.
func call[T any](ctx context.Context, c *Client, f func(ctx context.Context, s *server) (T, error)) (T, error) {
	var zero T
	if c.isClosed() {
		return zero, ErrClientClosed
	}
	r := c.newRetrier()
	for {
		i, timeout, err := r.next(ctx)
		if err != nil {
			return zero, err
		}
		actx, cancel := context.WithTimeout(ctx, timeout)
		v, err := f(actx, c.bal.servers[i])
		cancel()
		if err == nil {
			c.bal.report(i, false)
			return v, nil
		}
		if err := r.failed(ctx, i, err); err != nil {
			return zero, err
		}
	}
}
