package snowkeep

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"strconv"
	"strings"
	"time"
)

// Defaults of the retry rule (see Option).
const (
	DefaultRequestTimeout = 5 * time.Second
	DefaultRetryBudget    = 10 * time.Second
	DefaultBackoff        = 20 * time.Millisecond
	DefaultMaxBackoff     = time.Second
	// MaxCount is the most ids one NextIDs call or one stream batch carries.
	MaxCount = 100000
)

// TLSConfig names PEM files for TLS. With CAFile empty the system roots are
// trusted. CertFile and KeyFile, both or neither, are the client certificate
// and its key for mutual TLS. The files are read when the client is built.
type TLSConfig struct {
	CAFile   string
	CertFile string
	KeyFile  string
}

type config struct {
	apiKey         string
	tls            *TLSConfig
	requestTimeout time.Duration
	retryBudget    time.Duration
	backoff        time.Duration
	maxBackoff     time.Duration
}

// Option configures a Client (see New).
type Option func(*config)

// WithAPIKey sends "authorization: Bearer <key>" on every call. A key with
// whitespace or non-ASCII characters is refused by New (parameter api_key).
// An empty key sends none.
func WithAPIKey(key string) Option { return func(c *config) { c.apiKey = key } }

// WithTLS uses TLS with the given files for every endpoint that has no
// explicit http:// scheme (https:// endpoints use TLS in any case, with the
// system roots when WithTLS is not given).
func WithTLS(t TLSConfig) Option { return func(c *config) { c.tls = &t } }

// WithRequestTimeout sets the deadline of one attempt (default 5 s). For a
// stream it bounds the wait for the first batch and each next one.
func WithRequestTimeout(d time.Duration) Option {
	return func(c *config) { c.requestTimeout = d }
}

// WithRetryBudget bounds a whole call, retries and sleeps included (default
// 10 s); when it is spent the call fails with the last retryable error.
func WithRetryBudget(d time.Duration) Option { return func(c *config) { c.retryBudget = d } }

// WithBackoff sets the sleep after a round in which every endpoint failed
// (initial, default 20 ms), doubling per round up to max (default 1 s), each
// sleep scaled by a random factor in [0.8, 1.2]. The same durations time an
// endpoint's ejection after a retryable failure.
func WithBackoff(initial, max time.Duration) Option {
	return func(c *config) { c.backoff, c.maxBackoff = initial, max }
}

func (c *config) validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"request_timeout", c.requestTimeout}, {"retry_budget", c.retryBudget},
		{"backoff", c.backoff}, {"max_backoff", c.maxBackoff}} {
		if d.v <= 0 {
			return invalidArg("%s must be positive, got %v", d.name, d.v)
		}
	}
	if c.maxBackoff < c.backoff {
		return invalidArg("max_backoff (%v) must not be below backoff (%v)", c.maxBackoff, c.backoff)
	}
	for _, r := range c.apiKey {
		if r > 0x7e || r <= 0x20 {
			return invalidArg("api_key must be printable ASCII without whitespace, got a key with %q", r)
		}
	}
	return nil
}

// endpoint is one parsed server address.
type endpoint struct {
	raw    string
	target string // host:port
	tls    bool   // https://, or no scheme with WithTLS
	plain  bool   // explicit http://
}

func parseEndpoint(raw string) (endpoint, error) {
	bad := func(why string) error {
		return invalidArg("endpoints: %q is not host:port, http://host:port or https://host:port: %s", raw, why)
	}
	e := endpoint{raw: raw}
	rest := raw
	if i := strings.Index(rest, "://"); i >= 0 {
		switch rest[:i] {
		case "http":
			e.plain = true
		case "https":
			e.tls = true
		default:
			return e, bad("unknown scheme " + strconv.Quote(rest[:i]))
		}
		rest = strings.TrimSuffix(rest[i+3:], "/")
	}
	i := strings.LastIndex(rest, ":")
	if i < 0 {
		return e, bad("no port")
	}
	host, port := rest[:i], rest[i+1:]
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		if len(host) < 3 {
			return e, bad("empty host")
		}
	} else if host == "" || strings.ContainsAny(host, ":/[]@?# ") {
		return e, bad("bad host")
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 || port != strconv.Itoa(p) {
		return e, bad("port must be 1 to 65535")
	}
	e.target = rest
	return e, nil
}

func parseEndpoints(raw []string) ([]endpoint, error) {
	if len(raw) == 0 {
		return nil, invalidArg("endpoints: give at least one server address")
	}
	out := make([]endpoint, 0, len(raw))
	for _, r := range raw {
		e, err := parseEndpoint(r)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// loadTLS reads the files of t into a *tls.Config; nil t gives the system
// roots.
func loadTLS(t *TLSConfig) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t == nil {
		return cfg, nil
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, invalidArg("tls.ca: cannot read %q: %v", t.CAFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, invalidArg("tls.ca: %q holds no PEM certificate", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	if t.CertFile == "" && t.KeyFile == "" {
		return cfg, nil
	}
	if t.CertFile == "" {
		return nil, invalidArg("tls.cert: a client key (%q) needs its certificate", t.KeyFile)
	}
	if t.KeyFile == "" {
		return nil, invalidArg("tls.key: a client certificate (%q) needs its key", t.CertFile)
	}
	certPEM, err := os.ReadFile(t.CertFile)
	if err != nil {
		return nil, invalidArg("tls.cert: cannot read %q: %v", t.CertFile, err)
	}
	keyPEM, err := os.ReadFile(t.KeyFile)
	if err != nil {
		return nil, invalidArg("tls.key: cannot read %q: %v", t.KeyFile, err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, invalidArg("tls.cert: %q with tls.key %q: %v", t.CertFile, t.KeyFile, err)
	}
	cfg.Certificates = []tls.Certificate{pair}
	return cfg, nil
}
