package discovery

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/engine"
)

// Keys of the --engine syntax after NAME=URL.
const (
	keyEvents      = "events"
	keyReplay      = "replay"
	keySnapshot    = "snapshot"
	keyWarmupUntil = "warmup-until"
	keyBlockSize   = "block-size"
	keyKind        = "kind"
	keyRole        = "role"
)

var flagKeys = []string{keyEvents, keyReplay, keySnapshot, keyWarmupUntil, keyBlockSize, keyKind, keyRole}

// ParseEngineFlag parses one --engine value (also one line of --engines-file):
//
//	NAME=http://HOST:PORT;events=tcp://HOST:P0,tcp://HOST:P1;replay=tcp://HOST:R0,tcp://HOST:R1;snapshot=tcp://HOST:S0,tcp://HOST:S1;warmup-until=RFC3339;block-size=N;kind=vllm|sglang|trtllm;role=prefill|decode
//
// role is the engine's pool in a disaggregated fleet (what the operator's
// serving.kvroute.io/role pod label says in a cluster); without it the engine computes whole
// requests.
// Everything after the URL is optional and may come in any order, each key once. events,
// replay and snapshot list one endpoint per DP rank in rank order, the same count when more
// than one is given;
// replay alone is for a router in bound mode (--events-bind), where the engines dial in with
// their events but still serve replay on their own sockets.
// The engine is Ready (a static engine is routable until its requests fail).
func ParseEngineFlag(s string) (Engine, error) {
	e, err := parseEngine(s)
	if err != nil {
		return Engine{}, fmt.Errorf("engine %q: %w", s, err)
	}
	return e, nil
}

func parseEngine(s string) (Engine, error) {
	parts := strings.Split(strings.TrimSpace(s), ";")
	name, rawURL, ok := strings.Cut(parts[0], "=")
	if !ok {
		return Engine{}, errors.New("want NAME=http://HOST:PORT[;events=...][;replay=...][;snapshot=...][;warmup-until=RFC3339][;block-size=N][;kind=vllm|sglang|trtllm][;role=prefill|decode]")
	}
	name = strings.TrimSpace(name)
	if err := checkName(name); err != nil {
		return Engine{}, err
	}
	u, err := parseEngineURL(strings.TrimSpace(rawURL))
	if err != nil {
		return Engine{}, err
	}
	e := Engine{Name: name, URL: u, Ready: true}
	seen := map[string]bool{}
	var replayGiven, snapshotGiven bool
	for _, part := range parts[1:] {
		part = strings.TrimSpace(part)
		if part == "" {
			continue // a trailing ';' is harmless
		}
		key, val, ok := strings.Cut(part, "=")
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		if !ok {
			return Engine{}, fmt.Errorf("%q is not key=value (keys: %s)", part, strings.Join(flagKeys, ", "))
		}
		if seen[key] {
			return Engine{}, fmt.Errorf("%s is given twice", key)
		}
		seen[key] = true
		switch key {
		case keyEvents, keyReplay, keySnapshot:
			eps, err := parseEndpoints(key, val)
			if err != nil {
				return Engine{}, err
			}
			switch key {
			case keyEvents:
				e.Events = eps
			case keyReplay:
				e.Replay, replayGiven = eps, true
			default:
				e.Snapshot, snapshotGiven = eps, true
			}
		case keyWarmupUntil:
			t, err := time.Parse(time.RFC3339Nano, val)
			if err != nil {
				return Engine{}, fmt.Errorf("warmup-until %q is not an RFC 3339 time such as 2026-01-02T15:04:05Z", val)
			}
			e.WarmupUntil = t
		case keyBlockSize:
			n, err := strconv.Atoi(val)
			if err != nil || !blockkey.ValidBlockSize(int64(n)) {
				return Engine{}, fmt.Errorf("block-size %q is not a number of tokens in 1..%d", val, blockkey.MaxBlockSize)
			}
			e.BlockSize = n
		case keyKind:
			k, err := engine.Parse(val)
			if err != nil || val == "" {
				return Engine{}, fmt.Errorf("kind %q is not one of vllm, sglang, trtllm", val)
			}
			e.Kind = k
		case keyRole:
			if val != config.RolePrefill && val != config.RoleDecode {
				return Engine{}, fmt.Errorf("role %q is not %s or %s", val, config.RolePrefill, config.RoleDecode)
			}
			e.Role = val
		default:
			return Engine{}, fmt.Errorf("unknown key %q (keys: %s)", key, strings.Join(flagKeys, ", "))
		}
	}
	if err := checkReplay(e); replayGiven && err != nil {
		return Engine{}, err
	}
	if err := checkSnapshot(e); snapshotGiven && err != nil {
		return Engine{}, err
	}
	return e, nil
}

// checkReplay: replay pairs with events rank by rank when both are given. Replay alone is
// bound mode's shape (the events come in over the router's bound socket, told apart by topic).
func checkReplay(e Engine) error {
	if len(e.Replay) > 0 && len(e.Events) > 0 && len(e.Replay) != len(e.Events) {
		return fmt.Errorf("replay has %d endpoints but events has %d: give one per DP rank, in rank order", len(e.Replay), len(e.Events))
	}
	return nil
}

// checkSnapshot: snapshot pairs rank by rank with the events and the replay endpoints given.
func checkSnapshot(e Engine) error {
	for _, o := range []struct {
		key string
		eps []string
	}{{keyEvents, e.Events}, {keyReplay, e.Replay}} {
		if len(e.Snapshot) > 0 && len(o.eps) > 0 && len(e.Snapshot) != len(o.eps) {
			return fmt.Errorf("snapshot has %d endpoints but %s has %d: give one per DP rank, in rank order", len(e.Snapshot), o.key, len(o.eps))
		}
	}
	return nil
}

// checkName keeps names usable where the router writes them: the x-kvroute-engine header
// (NAME/rank), metric labels and the engine-file syntax.
func checkName(name string) error {
	if name == "" {
		return errors.New("the engine name before '=' is empty")
	}
	for _, r := range name {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) || strings.ContainsRune("=;,/#", r) {
			return fmt.Errorf("engine name %q contains %q (names may not contain spaces, control characters or any of = ; , / #)", name, r)
		}
	}
	return nil
}

// parseEngineURL accepts http(s)://host[:port] and drops a trailing '/'; a path is refused
// because the proxy appends the OpenAI paths to the URL as it is.
func parseEngineURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("URL %q: %v", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("URL %q is not http:// or https://", raw)
	}
	if u.Hostname() == "" {
		return "", fmt.Errorf("URL %q has no host", raw)
	}
	if p := u.Port(); p != "" {
		if err := checkPort(p); err != nil {
			return "", fmt.Errorf("URL %q: %w", raw, err)
		}
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("URL %q must be scheme://host:port only (no path, query, fragment or user)", raw)
	}
	return u.Scheme + "://" + u.Host, nil
}

func parseEndpoints(key, val string) ([]string, error) {
	if val == "" {
		return nil, fmt.Errorf("%s= lists no endpoints (leave the key out for none)", key)
	}
	items := strings.Split(val, ",")
	out := make([]string, len(items))
	for r, it := range items {
		ep, err := parseEndpoint(strings.TrimSpace(it))
		if err != nil {
			return nil, fmt.Errorf("%s rank %d: %w", key, r, err)
		}
		out[r] = ep
	}
	return out, nil
}

// parseEndpoint accepts the tcp://host:port the router connects to ("*" is a bind address,
// not one to connect to).
func parseEndpoint(ep string) (string, error) {
	u, err := url.Parse(ep)
	if err != nil || u.Scheme != "tcp" || u.Opaque != "" {
		return "", fmt.Errorf("%q is not a tcp://HOST:PORT endpoint", ep)
	}
	host, port := u.Hostname(), u.Port()
	if host == "" || host == "*" {
		return "", fmt.Errorf("%q has no host to connect to", ep)
	}
	// A host with a colon is an IPv6 literal, and only a bracketed valid one: tcp://0::1 would
	// split at its last colon into host "0:" and port 1, and render back as tcp://[0:]:1.
	if strings.Contains(host, ":") && (net.ParseIP(host) == nil || !strings.HasPrefix(u.Host, "[")) {
		return "", fmt.Errorf("%q: an IPv6 host is written in brackets, tcp://[ADDRESS]:PORT", ep)
	}
	if err := checkPort(port); err != nil {
		return "", fmt.Errorf("%q: %w", ep, err)
	}
	if u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("%q must be tcp://HOST:PORT only", ep)
	}
	return "tcp://" + net.JoinHostPort(host, port), nil
}

func checkPort(p string) error {
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != p {
		return fmt.Errorf("port %q is not in 1..65535", p)
	}
	return nil
}

// String renders the engine in the --engine syntax; ParseEngineFlag(e.String()) gives e back
// for every engine ParseEngineFlag accepts.
func (e Engine) String() string {
	var b strings.Builder
	b.WriteString(e.Name)
	b.WriteByte('=')
	b.WriteString(e.URL)
	if len(e.Events) > 0 {
		b.WriteString(";" + keyEvents + "=" + strings.Join(e.Events, ","))
	}
	if len(e.Replay) > 0 {
		b.WriteString(";" + keyReplay + "=" + strings.Join(e.Replay, ","))
	}
	if len(e.Snapshot) > 0 {
		b.WriteString(";" + keySnapshot + "=" + strings.Join(e.Snapshot, ","))
	}
	if !e.WarmupUntil.IsZero() {
		b.WriteString(";" + keyWarmupUntil + "=" + e.WarmupUntil.Format(time.RFC3339Nano))
	}
	if e.BlockSize > 0 {
		b.WriteString(";" + keyBlockSize + "=" + strconv.Itoa(e.BlockSize))
	}
	if e.Kind != "" {
		b.WriteString(";" + keyKind + "=" + string(e.Kind))
	}
	if e.Role != "" {
		b.WriteString(";" + keyRole + "=" + e.Role)
	}
	return b.String()
}
