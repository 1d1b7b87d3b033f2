// Package peers runs several real kvrouter processes in front of vllm-sim engines over loopback:
// load shared between router replicas, a router killed, a router started after the engines'
// rings wrapped, and a partition between routers cut by an in-test TCP proxy (issue 24).
package peers
