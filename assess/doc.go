// Package assess answers the first question before any KV-aware router is installed: does this
// fleet's traffic deserve one? It reads the vLLM counters the engines already export, either from
// Prometheus or by scraping the engines twice a window apart, and turns them into a verdict.
//
// The pipeline has three separable steps so each can be tested on its own:
//
//	collect (CollectPrometheus or CollectEngines)  -> Snapshot   (I/O)
//	Decide(Snapshot, Thresholds)                    -> Assessment (pure)
//	RenderTable / RenderMarkdown / RenderJSON       -> text       (pure)
//
// It lives at the repository root rather than under router/ because nothing in it depends on the
// router: it measures a fleet that has no kvroute at all, and kvroutectl is its only user.
package assess
