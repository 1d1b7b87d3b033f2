// Command zmqcheck links libzmq through cgo like kvrouter and vllm-sim, and exercises it: a PUB
// and a SUB socket over tcp on loopback carry one message. test/images runs it under chroot in
// the runtime layer alone, to show the layer is self-contained without building the full images.
package main

import (
	"fmt"
	"os"
	"time"

	zmq "github.com/pebbe/zmq4"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "zmqcheck:", err)
		os.Exit(1)
	}
}

func run() error {
	major, minor, patch := zmq.Version()
	pub, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		return err
	}
	defer pub.Close()
	if err := pub.Bind("tcp://127.0.0.1:*"); err != nil {
		return err
	}
	ep, err := pub.GetLastEndpoint()
	if err != nil {
		return err
	}
	sub, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		return err
	}
	defer sub.Close()
	if err := sub.Connect(ep); err != nil {
		return err
	}
	if err := sub.SetSubscribe(""); err != nil {
		return err
	}
	if err := sub.SetRcvtimeo(100 * time.Millisecond); err != nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if _, err := pub.Send("hello", 0); err != nil {
			return err
		}
		if msg, err := sub.Recv(0); err == nil {
			fmt.Printf("libzmq %d.%d.%d: %s over %s\n", major, minor, patch, msg, ep)
			return nil
		}
	}
	return fmt.Errorf("no message over %s", ep)
}
