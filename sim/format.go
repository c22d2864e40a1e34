package sim

import "strconv"

func strconvFloat(f float64) string { return strconv.FormatFloat(f, 'f', 6, 64) }
