package discovery_test

import (
	"fmt"

	"github.com/kvroute/kvroute/router/discovery"
)

func ExampleParseEngineFlag() {
	e, err := discovery.ParseEngineFlag("e0=http://10.0.0.5:8000;events=tcp://10.0.0.5:5557,tcp://10.0.0.5:5558;replay=tcp://10.0.0.5:5600,tcp://10.0.0.5:5601")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(e.Name, e.URL, e.Ranks(), e.Events[1], e.Ready)

	_, err = discovery.ParseEngineFlag("e1=http://10.0.0.6:8000;events=tcp://10.0.0.6:5557;replay=tcp://10.0.0.6:5600,tcp://10.0.0.6:5601")
	fmt.Println(err)
	// Output:
	// e0 http://10.0.0.5:8000 2 tcp://10.0.0.5:5558 true
	// engine "e1=http://10.0.0.6:8000;events=tcp://10.0.0.6:5557;replay=tcp://10.0.0.6:5600,tcp://10.0.0.6:5601": replay has 2 endpoints but events has 1: give one per DP rank, in rank order
}
