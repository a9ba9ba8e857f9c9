package snowkeep

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "example.invalid/snowkeep/clients/go/gen/snowkeepv1"
)

// Requester is who an embedded generator is, to the Lease API: the host,
// the process (pid and start time, so a restarted process is a new requester
// even as PID 1 in a container) and a random nonce per generator (two
// generators of one process are two requesters, never sharing machine ids).
// It names a requester and grants nothing: Renew, Check and Release also
// need the lease token Acquire returned, which the generator keeps in memory.
type Requester struct {
	// HostID is /etc/machine-id (else /var/lib/dbus/machine-id, else the
	// host name), at most 128 characters of A-Z a-z 0-9 . _ -.
	HostID string
	// PID is the process id.
	PID uint32
	// StartUnixMs is the process start time, ms since the Unix epoch, from
	// /proc/self/stat (else the time of the first call in the process).
	StartUnixMs uint64
	// Nonce is 32 hex digits drawn at random for each generator.
	Nonce string
}

// CurrentRequester is this process with a fresh nonce: what StartEmbedded
// uses when EmbeddedConfig.Requester is the zero value.
func CurrentRequester() Requester {
	return Requester{HostID: hostID(), PID: uint32(os.Getpid()), StartUnixMs: processStartUnixMs(),
		Nonce: newNonce()}
}

// WithNewNonce is a copy with a fresh nonce: another requester of the same
// process.
func (r Requester) WithNewNonce() Requester {
	r.Nonce = newNonce()
	return r
}

// Tag is a short name for logs: the first 12 hex digits of the SHA-256 of
// "host_id:pid:start_unix_ms:nonce", the tag the server logs the requester
// by (it never logs the identity itself).
func (r Requester) Tag() string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s:%d:%d:%s", r.HostID, r.PID, r.StartUnixMs, r.Nonce))
	return hex.EncodeToString(sum[:6])
}

func (r Requester) toPB() *pb.Requester {
	return &pb.Requester{HostId: r.HostID, Pid: r.PID, StartUnixMs: r.StartUnixMs, Nonce: r.Nonce}
}

func newNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

func keepIDChars(s string) string {
	var b strings.Builder
	for _, c := range strings.TrimSpace(s) {
		if b.Len() == 128 {
			break
		}
		if c < 0x80 && (c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			strings.ContainsRune("._-", c)) {
			b.WriteRune(c)
		}
	}
	return b.String()
}

func hostID() string {
	for _, p := range []string{"/etc/machine-id", "/var/lib/dbus/machine-id"} {
		if text, err := os.ReadFile(p); err == nil {
			if id := keepIDChars(string(text)); id != "" {
				return id
			}
		}
	}
	if h, err := os.Hostname(); err == nil {
		if id := keepIDChars(h); id != "" {
			return id
		}
	}
	return "unknown-host"
}

// userHz is Linux's clock ticks per second for /proc times (USER_HZ).
const userHz = 100

var firstCall = sync.OnceValue(func() uint64 { return uint64(time.Now().UnixMilli()) })

func processStartUnixMs() uint64 {
	if ms, ok := fromProc(); ok {
		return ms
	}
	return firstCall()
}

func fromProc() (uint64, bool) {
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, false
	}
	// Field 22 (starttime) counts from after the ")" that closes the command name.
	i := strings.LastIndexByte(string(stat), ')')
	fields := strings.Fields(string(stat[i+1:]))
	if i < 0 || len(fields) < 20 {
		return 0, false
	}
	ticks, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return 0, false
	}
	procStat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(procStat), "\n") {
		if rest, ok := strings.CutPrefix(line, "btime "); ok {
			boot, err := strconv.ParseUint(strings.TrimSpace(rest), 10, 64)
			if err != nil {
				return 0, false
			}
			return boot*1000 + ticks*1000/userHz, true
		}
	}
	return 0, false
}
