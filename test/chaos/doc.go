// Package chaos is kvroute's fault suite: real kvrouter binaries in front of real ZMQ publishers
// and replay rings, faults injected from outside, and assertions that the router stays up,
// counts what it dropped and converges to the engines' truth. `make chaos` runs all of it;
// `make test` runs the cases that finish in seconds.
package chaos
