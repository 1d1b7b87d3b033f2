package config

import (
	"strings"
	"testing"
)

func TestServedModelReportModeAndReport(t *testing.T) {
	c, err := Parse([]byte("servedModelName: qwen\nkvCacheReportMode: full\nreport: {namespace: ns, kvRoutedModel: m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.ServedModelName != "qwen" || c.KVCacheReportMode != "full" || c.Report == nil || c.Report.KVRoutedModel != "m" {
		t.Fatalf("%+v", c)
	}
	for in, want := range map[string]string{
		"kvCacheReportMode: fulll\n": "kvCacheReportMode",
		"report: {namespace: ns}\n":  "report",
	} {
		if _, err := Parse([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error naming %s", in, err, want)
		}
	}
}

func TestPeers(t *testing.T) {
	c, err := Parse([]byte("peers: {subject: kvroute.load.m, clusterListen: '0.0.0.0:6222', routes: ['kvrouter-peers.ns.svc:6222'], peerTimeout: 3s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Peers == nil || c.Peers.Routes[0] != "kvrouter-peers.ns.svc:6222" || c.Peers.PeerTimeout.Seconds() != 3 {
		t.Fatalf("%+v", c.Peers)
	}
	for in, want := range map[string]string{
		"peers: {routes: ['a:1']}\n":                          "peers.routes",
		"peers: {url: 'nats://x:4222', routes: ['a:1']}\n":    "peers.url",
		"peers: {clusterListen: nope}\n":                      "peers.clusterListen",
		"peers: {url: 'nats://x:4222', tls: {certFile: a}}\n": "peers.tls",
	} {
		if _, err := Parse([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error naming %s", in, err, want)
		}
	}
}
