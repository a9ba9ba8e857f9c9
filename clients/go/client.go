package snowkeep

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	pb "example.invalid/snowkeep/clients/go/gen/snowkeepv1"
)

// Client calls snowkeep servers (snowkeep.v1 IdService and InfoService). It
// is safe for concurrent use; make one per process and share it. Calls go to
// the endpoints round-robin, skipping ejected ones, and follow the retry
// rule described on New.
type Client struct {
	cfg    config
	bal    *balancer
	closed atomic.Bool

	layoutMu sync.Mutex
	layout   *Layout
}

// New builds a client of endpoints, each "host:port", "http://host:port" or
// "https://host:port" (TLS). It makes no call: connections open lazily, on
// the first call.
//
// Retry rule: each attempt has a deadline (WithRequestTimeout, default 5 s).
// After a retryable failure (see IsRetryableCode; a transport failure counts
// as UNAVAILABLE) the endpoint is ejected and the next attempt goes at once to
// the next endpoint not yet tried in this round; after a round in which every
// endpoint failed the call sleeps (WithBackoff: 20 ms doubling up to 1 s, ±20%
// jitter). The whole call is bounded by WithRetryBudget (default 10 s); when
// it is spent the call fails with the last retryable error. Other codes
// surface at once as *Error; a cancellation of the caller's context returns
// ctx.Err() at once.
//
// New fails with an INVALID_ARGUMENT *Error naming the parameter for an
// empty or malformed endpoint list ("endpoints"), an API key with whitespace
// or non-ASCII characters ("api_key"), an unreadable or unusable TLS file
// ("tls.ca", "tls.cert", "tls.key") or a non-positive duration.
func New(endpoints []string, opts ...Option) (*Client, error) {
	cfg := config{
		requestTimeout: DefaultRequestTimeout,
		retryBudget:    DefaultRetryBudget,
		backoff:        DefaultBackoff,
		maxBackoff:     DefaultMaxBackoff,
	}
	for _, o := range opts {
		o(&cfg)
	}
	eps, err := parseEndpoints(endpoints)
	if err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	tlsCfg, err := loadTLS(cfg.tls)
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, bal: &balancer{
		backoff: cfg.backoff, maxBackoff: cfg.maxBackoff, now: time.Now,
	}}
	for _, ep := range eps {
		conn, err := grpc.NewClient("passthrough:///"+ep.target, c.dialOptions(ep, tlsCfg)...)
		if err != nil {
			_ = c.Close()
			return nil, invalidArg("endpoints: %q: %v", ep.raw, err)
		}
		c.bal.servers = append(c.bal.servers, &server{
			ep: ep, conn: conn,
			ids: pb.NewIdServiceClient(conn), info: pb.NewInfoServiceClient(conn),
		})
	}
	return c, nil
}

func (c *Client) dialOptions(ep endpoint, tlsCfg *tls.Config) []grpc.DialOption {
	return dialOptions(c.cfg, ep, tlsCfg)
}

// dialOptions are the gRPC options of a connection to ep under cfg (TLS,
// reconnect backoff, API key); the embedded generator dials with them too.
func dialOptions(cfg config, ep endpoint, tlsCfg *tls.Config) []grpc.DialOption {
	useTLS := ep.tls || (!ep.plain && cfg.tls != nil)
	creds := insecure.NewCredentials()
	if useTLS {
		creds = credentials.NewTLS(tlsCfg.Clone())
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// Reconnect on the client's own backoff, so a server that comes back
		// is used again within max_backoff.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay: cfg.backoff, Multiplier: 2, Jitter: 0.2, MaxDelay: cfg.maxBackoff,
			},
			MinConnectTimeout: cfg.requestTimeout,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20)),
	}
	if cfg.apiKey != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{key: cfg.apiKey}))
	}
	return opts
}

// bearer sends the API key as "authorization: Bearer <key>".
type bearer struct{ key string }

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.key}, nil
}

func (b bearer) RequireTransportSecurity() bool { return false }

// Close closes every connection. Calls made after it fail with
// ErrClientClosed (FAILED_PRECONDITION "client closed"); calls in flight end
// with it or with the error their cancelled attempt saw. Close is idempotent.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	var first error
	for _, s := range c.bal.servers {
		if err := s.conn.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (c *Client) isClosed() bool { return c.closed.Load() }

// NextIDs returns n ids (1 to MaxCount), strictly ascending, all from one
// server, following the retry rule. A count outside the range fails before
// any call with an INVALID_ARGUMENT *Error naming count.
func (c *Client) NextIDs(ctx context.Context, n int) ([]uint64, error) {
	if n < 1 || n > MaxCount {
		return nil, invalidArg("count must be 1 to %d, got %d", MaxCount, n)
	}
	req := &pb.NextIdsRequest{Count: uint32(n)}
	return call(ctx, c, func(ctx context.Context, s *server) ([]uint64, error) {
		r, err := s.ids.NextIds(ctx, req)
		if err != nil {
			return nil, err
		}
		if len(r.GetIds()) != n {
			return nil, &Error{code: codes.Internal,
				msg: fmt.Sprintf("asked for %d ids, the server returned %d", n, len(r.GetIds()))}
		}
		return r.GetIds(), nil
	})
}
