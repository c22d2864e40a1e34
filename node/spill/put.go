package spill

func runsLen(runs [][]byte) int64 {
	var n int64
	for _, r := range runs {
		n += int64(len(r))
	}
	return n
}
