package cli

import (
	"io"
	"os"
	"path/filepath"
	"testing"
)

// The config the operator renders sets the served model name and the full report mode; flags
// still win.
func TestConfigServedModelAndReportMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte("servedModelName: qwen\nkvCacheReportMode: full\nreport: {namespace: llm, kvRoutedModel: qwen}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := parse([]string{"--config", path, "--engine", "a=http://127.0.0.1:1"}, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.model != "qwen" || !st.fullReport || st.cfg.Report == nil || st.cfg.Report.KVRoutedModel != "qwen" {
		t.Fatalf("settings %+v", st)
	}
	if st, err = parse([]string{"--config", path, "--model", "other", "--engine", "a=http://127.0.0.1:1"}, io.Discard, nil); err != nil || st.model != "other" {
		t.Fatalf("--model over the config: %q %v", st.model, err)
	}
}
