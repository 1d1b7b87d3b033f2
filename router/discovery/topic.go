package discovery

import (
	"errors"
	"fmt"
	"net"
	"strings"
)

// ParseTopic splits a bound-mode KV-event topic, <prefix>@<host>[:<port>]@<model>, the topic
// the operator gives vLLM (and llm-d's kv@<pod-ip>:<port>@<model>). vLLM treats the topic as
// opaque UTF-8, so the split is ours to define: the prefix and the host never contain '@' (a
// prefix is configuration, a host is an IP or DNS name), so the topic splits at its first two
// '@' and the model is everything after the second one — a served model name may contain '@'
// (e.g. "org/model@rev"). host is returned as written, with its port when one is given;
// IPv6 hosts with a port are bracketed ([fd00::1]:5557), without one they may be bare.
func ParseTopic(topic string) (prefix, host, model string, err error) {
	prefix, rest, ok := strings.Cut(topic, "@")
	if !ok {
		return "", "", "", fmt.Errorf("topic %q is not <prefix>@<host>[:<port>]@<model>: no '@'", topic)
	}
	host, model, ok = strings.Cut(rest, "@")
	if !ok {
		return "", "", "", fmt.Errorf("topic %q is not <prefix>@<host>[:<port>]@<model>: no '@' after the host", topic)
	}
	if prefix == "" {
		return "", "", "", fmt.Errorf("topic %q has an empty prefix", topic)
	}
	if model == "" {
		return "", "", "", fmt.Errorf("topic %q has an empty model", topic)
	}
	if err := checkTopicHost(host); err != nil {
		return "", "", "", fmt.Errorf("topic %q: %w", topic, err)
	}
	return prefix, host, model, nil
}

func checkTopicHost(host string) error {
	if host == "" {
		return errors.New("empty host")
	}
	if strings.ContainsAny(host, " \t\r\n/") {
		return fmt.Errorf("host %q contains a space or '/'", host)
	}
	if strings.HasPrefix(host, "[") || strings.Count(host, ":") == 1 {
		h, p, err := net.SplitHostPort(host)
		if err != nil {
			return fmt.Errorf("host %q: %v", host, err)
		}
		if h == "" {
			return fmt.Errorf("host %q has no name before the port", host)
		}
		return checkPort(p)
	}
	if strings.Contains(host, ":") && net.ParseIP(host) == nil {
		return fmt.Errorf("host %q is neither host:port nor a bare IPv6 address", host)
	}
	return nil
}
