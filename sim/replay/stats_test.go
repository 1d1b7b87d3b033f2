package replay

import (
	"math"
	"testing"
)

// Past the table (30 degrees of freedom) the 0.975 quantile of Student's t follows the exact
// values (R's qt(0.975, df)), not the normal 1.96: an interval over 35 seeds was 3% too narrow.
func TestTCrit95PastTheTable(t *testing.T) {
	for _, c := range []struct {
		df   int
		want float64
	}{{30, 2.042}, {31, 2.0395}, {34, 2.0322}, {40, 2.0211}, {60, 2.0003}, {120, 1.9799}, {1000, 1.9623}} {
		if got := tCrit95(c.df); math.Abs(got-c.want) > 0.001 {
			t.Errorf("t(0.975, %d) = %.4f, want %.4f", c.df, got, c.want)
		}
	}
	for df := 31; df < 500; df++ {
		if tCrit95(df) >= tCrit95(df-1) {
			t.Fatalf("t(0.975) not decreasing at %d degrees of freedom", df)
		}
	}
}
