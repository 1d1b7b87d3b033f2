// Package crd embeds the generated KVRoutedModel CRD, so offline tools validate with the very
// schema the cluster gets. hack/sync-embedded-crd.sh (run by `make manifests`) keeps this copy
// equal to config/crd/bases; a test fails when they differ.
package crd

import _ "embed"

// KVRoutedModelYAML is config/crd/bases/serving.kvroute.io_kvroutedmodels.yaml.
//
//go:embed serving.kvroute.io_kvroutedmodels.yaml
var KVRoutedModelYAML []byte
