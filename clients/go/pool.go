package snowkeep

import (
	"context"
	"sync"
	"time"
)

// PoolOption configures a Pool (see Client.NewPool).
type PoolOption func(*poolConfig)

type poolConfig struct {
	batch    int
	lowWater int
	lowSet   bool
	maxAge   time.Duration
}

// WithPoolBatch sets the ids fetched per refill, 1 to MaxCount (default 100).
func WithPoolBatch(n int) PoolOption { return func(c *poolConfig) { c.batch = n } }

// WithPoolLowWater sets the low-water mark: a refill starts whenever the
// buffer holds this many ids or fewer (0 to batch-1; default batch/4).
func WithPoolLowWater(n int) PoolOption {
	return func(c *poolConfig) { c.lowWater, c.lowSet = n, true }
}

// WithPoolMaxAge sets how long fetched ids stay usable, counted from the
// fetch (default 10 minutes); older ids are dropped, never handed out.
func WithPoolMaxAge(d time.Duration) PoolOption { return func(c *poolConfig) { c.maxAge = d } }

// Pool hands out ids one at a time from a local buffer that a background
// refill keeps filled with NextIDs (at most one refill in flight). Ids
// ascend within each fetched batch, not across batches. A Pool is safe for
// concurrent use.
type Pool struct {
	c   *Client
	cfg poolConfig

	ctx    context.Context // of the background refills; cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	chunks    []chunk
	buffered  int
	refilling bool
	closed    bool
	gen       uint64        // refills finished
	lastErr   error         // of the last finished refill; nil after a success
	done      chan struct{} // closed when a refill finishes (or at Close)
}

type chunk struct {
	ids     []uint64
	expires time.Time
}

// NewPool starts a pool over c: it fetches a batch at once, and again
// whenever the buffer falls to the low-water mark. Options out of range fail
// with an INVALID_ARGUMENT *Error naming batch, low_water or max_age.
func (c *Client) NewPool(opts ...PoolOption) (*Pool, error) {
	cfg := poolConfig{batch: 100, maxAge: 10 * time.Minute}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.batch < 1 || cfg.batch > MaxCount {
		return nil, invalidArg("batch must be 1 to %d, got %d", MaxCount, cfg.batch)
	}
	if !cfg.lowSet {
		cfg.lowWater = cfg.batch / 4
	}
	if cfg.lowWater < 0 || cfg.lowWater >= cfg.batch {
		return nil, invalidArg("low_water must be 0 to batch-1 (%d), got %d", cfg.batch-1, cfg.lowWater)
	}
	if cfg.maxAge <= 0 {
		return nil, invalidArg("max_age must be positive, got %v", cfg.maxAge)
	}
	if c.isClosed() {
		return nil, ErrClientClosed
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pool{c: c, cfg: cfg, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	p.mu.Lock()
	p.startRefill()
	p.mu.Unlock()
	return p, nil
}

// Next returns one id from the buffer. When the buffer is empty it waits for
// a refill; when that refill fails (its retry budget spent, or a
// non-retryable code) Next returns the refill's error. After Close it returns
// ErrPoolClosed; ctx ending while it waits returns ctx.Err().
func (p *Pool) Next(ctx context.Context) (uint64, error) {
	p.mu.Lock()
	for {
		if p.closed {
			p.mu.Unlock()
			return 0, ErrPoolClosed
		}
		if id, ok := p.pop(); ok {
			if p.buffered <= p.cfg.lowWater {
				p.startRefill()
			}
			p.mu.Unlock()
			return id, nil
		}
		p.startRefill()
		gen, done := p.gen, p.done
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-done:
		}
		p.mu.Lock()
		if p.gen != gen && p.lastErr != nil && p.buffered == 0 && !p.closed {
			err := p.lastErr
			p.mu.Unlock()
			return 0, err
		}
	}
}

// pop takes the oldest id that is not past max age; p.mu is held.
func (p *Pool) pop() (uint64, bool) {
	if p.buffered == 0 {
		return 0, false
	}
	now := p.c.bal.now()
	for len(p.chunks) > 0 {
		ch := &p.chunks[0]
		if len(ch.ids) == 0 || !now.Before(ch.expires) {
			p.buffered -= len(ch.ids)
			p.chunks[0] = chunk{}
			p.chunks = p.chunks[1:]
			continue
		}
		id := ch.ids[0]
		ch.ids = ch.ids[1:]
		p.buffered--
		return id, true
	}
	return 0, false
}

// Buffered is the number of ids in the buffer now (some may be past max age
// and dropped before they are handed out).
func (p *Pool) Buffered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.buffered
}

// startRefill starts the background refill unless one is in flight or the
// pool is closed; p.mu is held.
func (p *Pool) startRefill() {
	if p.refilling || p.closed {
		return
	}
	p.refilling = true
	p.wg.Add(1)
	go p.refill()
}

func (p *Pool) refill() {
	defer p.wg.Done()
	ids, err := p.c.NextIDs(p.ctx, p.cfg.batch)
	fetched := p.c.bal.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refilling = false
	if p.closed {
		return
	}
	p.gen++
	p.lastErr = err
	if err == nil {
		p.chunks = append(p.chunks, chunk{ids: ids, expires: fetched.Add(p.cfg.maxAge)})
		p.buffered += len(ids)
	}
	close(p.done)
	p.done = make(chan struct{})
	if err == nil && p.buffered <= p.cfg.lowWater {
		p.startRefill()
	}
}

// Close stops the background refill, waits for it to end and drops the
// buffer; Next then fails with ErrPoolClosed. Close is idempotent.
func (p *Pool) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.chunks, p.buffered = nil, 0
	close(p.done)
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
}
