package scrub

// What decoding or re-encoding a body can allocate, so a caller can reserve it
// before it starts: a compressed stream's window is its sender's choice (brotli's
// up to 16 MiB, its ring buffer allocated twice over as it grows), and an
// allowlisted upstream that compresses although it was asked for identity must not
// make egressd hold that outside its memory budget. TestCodingCosts measures each
// coding against these.
const (
	flateCost   = 96 << 10              // gzip, deflate: a 32 KiB window and the tables
	zstdCost    = zstdMaxWindow + 2<<20 // the largest window accepted, and its block buffers
	brMaxWBits  = 24                    // RFC 7932's largest window outside large-window mode
	brSlack     = 64 << 10              // brotli's state beside its ring buffer
	encodeCost  = 2 << 20               // gzip and deflate writers at BestSpeed
	zstdEncCost = 2 << 20               // the zstd writer with a 1 MiB window
	brEncCost   = 10 << 20              // the brotli writer at level 4
	maxCost     = maxCodings * (2<<brMaxWBits + brSlack)
)

// DecodeCost is the most that decoding a body of contentEncoding can allocate.
// first is the body's first byte when known (-1 otherwise): for a body compressed
// once with brotli it gives the window, so a small-window stream reserves little.
// An encoding DecodeReader refuses costs the most, harmlessly: it is refused.
func DecodeCost(contentEncoding string, first int) int64 {
	codings, err := parseCodings(contentEncoding)
	if err != nil {
		return maxCost
	}
	var n int64
	for i, c := range codings {
		switch c {
		case "br":
			bits := brMaxWBits
			if i == len(codings)-1 && first >= 0 {
				bits = brotliWindowBits(byte(first))
			}
			n += 2<<bits + brSlack
		case "zstd":
			n += zstdCost
		default:
			n += flateCost
		}
	}
	return n
}

// EncodeCost is the most that EncodeReader's writer for coding allocates.
func EncodeCost(coding string) int64 {
	switch coding {
	case "zstd":
		return zstdEncCost
	case "br":
		return brEncCost
	default:
		return encodeCost
	}
}

// brotliWindowBits reads WBITS from a brotli stream's first byte (RFC 7932
// section 9.1); a large-window or invalid header counts as the largest window,
// and the decoder refuses it anyway.
func brotliWindowBits(b byte) int {
	if b&1 == 0 {
		return 16
	}
	if n := int(b>>1) & 7; n != 0 {
		return 17 + n
	}
	switch m := int(b>>4) & 7; m {
	case 0:
		return 17
	case 1:
		return brMaxWBits
	default:
		return 8 + m
	}
}
