// Package engineflags holds the option names of SGLang's launch server and of trtllm-serve,
// read from each engine's source: the one list the operator's argument check
// (controllers/render) and the simulator's command-line reader (sim/vllmcli) both use.
package engineflags
