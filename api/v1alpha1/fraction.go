package v1alpha1

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// Fraction is a JSON number kept as its decimal text. controller-gen refuses float fields in
// CRDs (languages disagree on them), but the contract wants a plain number (credit: 0.5);
// a string-backed type marked as a number gives both, and keeps "0" distinct from unset.
// +kubebuilder:validation:Type=number
type Fraction string

// Float64 returns the value; an empty or malformed Fraction is 0.
func (f Fraction) Float64() float64 {
	v, err := strconv.ParseFloat(string(f), 64)
	if err != nil {
		return 0
	}
	return v
}

// MarshalJSON writes the number (or null when unset).
func (f Fraction) MarshalJSON() ([]byte, error) {
	if f == "" {
		return []byte("null"), nil
	}
	if _, err := strconv.ParseFloat(string(f), 64); err != nil {
		return nil, fmt.Errorf("fraction %q is not a number", string(f))
	}
	return []byte(f), nil
}

// UnmarshalJSON accepts a JSON number (and, leniently, a numeric string).
func (f *Fraction) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*f = ""
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("fraction: want a number, got %s", string(b))
	}
	if _, err := n.Float64(); err != nil {
		return fmt.Errorf("fraction: %q is not a number", n.String())
	}
	*f = Fraction(n.String())
	return nil
}
