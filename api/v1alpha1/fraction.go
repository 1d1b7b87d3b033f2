package v1alpha1

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// Fraction is a JSON number kept as its decimal text. controller-gen refuses float fields in
// CRDs (languages disagree on them), but the contract wants a plain number (credit: 0.5).
// It is a struct, not a string, because the unstructured converter refuses to turn a JSON
// integer (credit: 0) into a string-kinded type but does call a struct's UnmarshalJSON.
// The zero Fraction is "unset" and marshals as null, which the schema default replaces.
// +kubebuilder:validation:Type=number
type Fraction struct {
	// Text is the decimal text; exported so reflection-based equality (apiequality) works.
	Text string `json:"-"`
}

// NewFraction returns v as a Fraction.
func NewFraction(v float64) Fraction {
	return Fraction{Text: strconv.FormatFloat(v, 'f', -1, 64)}
}

// IsSet reports whether a value was given.
func (f Fraction) IsSet() bool { return f.Text != "" }

// String is the decimal text ("" when unset).
func (f Fraction) String() string { return f.Text }

// Float64 returns the value; an unset Fraction is 0.
func (f Fraction) Float64() float64 {
	v, err := strconv.ParseFloat(f.Text, 64)
	if err != nil {
		return 0
	}
	return v
}

// MarshalJSON writes the number, or null when unset.
func (f Fraction) MarshalJSON() ([]byte, error) {
	if f.Text == "" {
		return []byte("null"), nil
	}
	return []byte(f.Text), nil
}

// UnmarshalJSON accepts a JSON number or null.
func (f *Fraction) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*f = Fraction{}
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("fraction: want a number, got %s", string(b))
	}
	if _, err := n.Float64(); err != nil {
		return fmt.Errorf("fraction: %q is not a number", n.String())
	}
	*f = Fraction{Text: n.String()}
	return nil
}
