// Package peers runs several real kvrouter processes in front of vllm-sim engines over loopback:
// load shared between router replicas, a router killed, a router started after the engines'
// rings wrapped (its index compared with its peers' by content), a partition between routers
// cut by an in-test TCP proxy, an external NATS server (run in the test) gone and back,
// readiness with a dead engine, and the approximate index taken from a peer.
package peers
