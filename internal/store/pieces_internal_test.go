package store

import (
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
)

// A piece decodes to exactly what newPiece makes of the same rows, the
// extremes of int64 included, and malformed bytes are an error.
func TestPieceRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	bucket := int64(1_795_000_000) * 1e9
	for n := 0; n < 40; n++ {
		ids := make([]int64, n)
		rows := make([]flowSum, n)
		next := int64(0)
		for i := range ids {
			next += 1 + rng.Int64N(1000)
			ids[i] = next
			for f := range rows[i].fields() {
				switch rng.IntN(6) {
				case 0:
					rows[i].fields()[f] = math.MaxInt64
				case 1:
					rows[i].fields()[f] = math.MinInt64
				case 2, 3:
					rows[i].fields()[f] = rng.Int64() - rng.Int64()
				}
			}
			switch n % 4 {
			case 0:
				rows[i] = flowSum{first: bucket + 5, last: bucket + 7, c: [20]int64{3: 1, 18: 4}}
			case 1: // first and last seen at the bucket's start: constant columns
				rows[i] = flowSum{first: bucket, last: bucket, pid: 3}
			}
		}
		data := encodePiece(bucket, ids, rows)
		got, err := decodePiece(bucket, data)
		if err != nil {
			t.Fatalf("%d flows: %v", n, err)
		}
		want := newPiece(rows, ids)
		if n == 0 {
			want.ids = []int64{}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%d flows: decoded %+v, want %+v", n, got, want)
		}
		// Added straight from the bytes, twice and after a row, as
		// the rows one by one would be.
		var extra flowSum
		extra.pid, extra.c[latencyMaxIndex], extra.first = -5, math.MinInt64+3, math.MaxInt64
		enc, ref := newSums(), newSums()
		if n > 0 {
			enc.add(ids[0], &extra)
			ref.add(ids[0], &extra)
		}
		for pass := 0; pass < 2; pass++ {
			if err := enc.addEncoded(bucket, data); err != nil {
				t.Fatal(err)
			}
			for i := range rows {
				ref.add(ids[i], &rows[i])
			}
		}
		if !reflect.DeepEqual(enc.keys, ref.keys) || !reflect.DeepEqual(enc.flows, ref.flows) {
			t.Errorf("%d flows: added from the bytes %+v, row by row %+v", n, enc.flows, ref.flows)
		}
		for _, cut := range []int{0, 1, len(data) / 2, len(data) - 1} {
			if cut < len(data) && cut >= 0 {
				if _, err := decodePiece(bucket, data[:cut]); err == nil {
					t.Errorf("%d flows: %d of %d bytes decoded without error", n, cut, len(data))
				}
				if err := newSums().addEncoded(bucket, data[:cut]); err == nil {
					t.Errorf("%d flows: %d of %d bytes added without error", n, cut, len(data))
				}
			}
		}
	}
}

// A key pack decodes to the keys it was made of, in their order, each id
// at its place; malformed bytes are an error.
func TestKeyPackRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	str := func() string {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		return string(b)
	}
	for n := 0; n < 30; n++ {
		ids := make([]int64, n)
		keys := make([]flowKey, n)
		for i := range keys {
			ids[i] = int64(rng.IntN(1 << 26)) // beyond the dense index too
			keys[i] = flowKey{str(), str(), str(), str(), str(), uint16(rng.IntN(65536)), str(), str()}
		}
		data := encodeKeyPack(ids, keys)
		p, err := decodeKeyPack(data)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.keys) != n || (n > 0 && !reflect.DeepEqual(p.keys, keys)) {
			t.Fatalf("%d keys: decoded %+v, want %+v", n, p.keys, keys)
		}
		for i, id := range ids {
			if at, ok := p.place(id); !ok || keys[at] != keys[i] {
				t.Errorf("%d keys: id %d at %d (%v), want the key at %d", n, id, at, ok, i)
			}
		}
		if _, ok := p.place(1 << 40); ok {
			t.Errorf("an id never packed has a place")
		}
		for _, cut := range []int{0, 1, len(data) - 1} {
			if cut >= 0 && cut < len(data) {
				if _, err := decodeKeyPack(data[:cut]); err == nil && n > 0 {
					t.Errorf("%d keys: %d of %d bytes decoded", n, cut, len(data))
				}
			}
		}
	}
}
