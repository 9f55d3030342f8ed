//go:build !amd64

package tensor

// everyOther16Vector has no vector kernel on this architecture: the word loop does it all.
func everyOther16Vector(dst, src []byte) int { return 0 }

// e4m3ToBF16Vector has no vector kernel on this architecture: the lookup table does it all.
func e4m3ToBF16Vector(dst, src []byte) int { return 0 }

// bf16ToF32Vector has no vector kernel on this architecture: the word loop does it all.
func bf16ToF32Vector(dst, src []byte) int { return 0 }
