/*
 * The log path's inner loops, in C (logs/linecodec.py has the same in Python, the reference
 * and the fallback where this was not built).
 *
 *   scan(data, max_line) -> int
 *       data: complete lines joined by '\n' (no trailing one).  The number of lines when
 *       every byte is printable ASCII that a JSON string holds verbatim (0x20..0x7f but '"'
 *       and '\\'; '\n' separates) and no line is longer than max_line bytes; else -1.
 *
 *   encode(data, count, head, seq0, mid, tail) -> bytes
 *       For each of the count lines of a scanned data: head, the decimal seq (seq0, seq0+1,
 *       ...), mid, the line, tail.  One allocation, one pass.
 *
 *   prefix(data, count, head) -> bytes
 *       For each of the count lines of data: head, the line, '\n' (the echo's "r3 out | "
 *       lines).  One allocation, one pass.
 *
 *   mentions(data, words) -> bool
 *       True when one of the words (a tuple of bytes) occurs in data: the line watcher's
 *       questions of a frame (a loss, an epoch, a NaN), asked of 256 KiB frames in a flood.
 *
 *   read_lines(fd, held, max_read, max_line) -> (text, rest, nread, count)
 *       The drain's read of a pipe and the scan above in one call (below, where it is defined).
 *
 *   wait_bytes(fd, bell_r, bell_w) -> int
 *       The drain's wait on an emptied pipe without poll(2) (below, where it is defined).
 *
 *   EchoWriter(fd, max_bytes, max_items, note_head, note_tail)
 *       The echo's writer thread, which prefixes (above) and writes frames without the GIL
 *       (below, where it is defined).
 *
 *   append_records(fd, dir_fd, name, dev, ino, frames, tail) -> (written, total, err)
 *       The writer's check of its live file's name, the encode above of several frames and
 *       the write of their records, in one call (below, where it is defined).
 *
 *   simd: str
 *       The scan's width in use: "avx512bw" or "avx2" (64 bytes a step, chosen at import where
 *       the CPU has it; DFLASHD_SIMD=sse2 or avx2 holds it lower), "sse2", or "none".
 *
 * The first four read only their immutable arguments, so a large input is handled without the
 * GIL: the drain thread's scan and the writer thread's encode run at once on two cores.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

/* From 64 KiB on, without the GIL (smaller: the hand-off costs more than it gives).  A flood's
   reads are mostly 60-250 KiB (the drain keeps up with the pipe), so at 256 KiB they all ran
   holding it: 64 KiB gave block writes +10 % on the 16-core host (issue 53). */
#define GIL_FREE_BYTES (64 * 1024)

/* A byte JSON cannot hold verbatim: outside printable ASCII ('\n' aside), '"' or '\\'. */
static inline int unsafe_byte(unsigned char c)
{
    return (c < 0x20 && c != '\n') || c >= 0x80 || c == '"' || c == '\\';
}

#if defined(__SSE2__)
/* One pass, 16 bytes a step (SSE2 is in every x86-64): the unsafe bytes and the newlines of a
   block found by four compares, each newline then taken from the mask.  It was two passes, a
   byte loop for the unsafe bytes and memchr per line: 42 -> 17 us for a 240 KiB frame of
   ~110-byte lines on the 2-core box (tests/perf/codec_cost.py; issue 53). */
#include <emmintrin.h>

/* The scan's tail, byte by byte, from i (line_start: where the current line began). */
static inline Py_ssize_t scan_rest(const unsigned char *p, Py_ssize_t i, Py_ssize_t n,
                                   Py_ssize_t max_line, Py_ssize_t lines, Py_ssize_t line_start)
{
    for (; i < n; i++) {
        unsigned char c = p[i];
        if (c == '\n') {
            if (i - line_start > max_line)
                return -1;
            line_start = i + 1;
            lines++;
        } else if (unsafe_byte(c)) {
            return -1;
        }
    }
    return n - line_start > max_line ? -1 : lines;
}

static Py_ssize_t scan_lines_sse2(const unsigned char *p, Py_ssize_t n, Py_ssize_t max_line)
{
    const __m128i space = _mm_set1_epi8(0x20), newline = _mm_set1_epi8('\n');
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
    Py_ssize_t i = 0, lines = 1, line_start = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + i));
        __m128i is_nl = _mm_cmpeq_epi8(v, newline);
        /* a signed compare: below 0x20, and 0x80 and up (negative), in one */
        __m128i bad = _mm_andnot_si128(is_nl, _mm_cmplt_epi8(v, space));
        bad = _mm_or_si128(bad, _mm_or_si128(_mm_cmpeq_epi8(v, quote),
                                             _mm_cmpeq_epi8(v, backslash)));
        if (_mm_movemask_epi8(bad))
            return -1;
        unsigned mask = (unsigned)_mm_movemask_epi8(is_nl);
        while (mask) {
            Py_ssize_t at = i + __builtin_ctz(mask);
            if (at - line_start > max_line)
                return -1;
            line_start = at + 1;
            lines++;
            mask &= mask - 1;
        }
    }
    return scan_rest(p, i, n, max_line, lines, line_start);
}

/* The next '\n' in [p, end), or NULL: a line is ~100 bytes, where a call of memchr costs more
   than the search (encode and prefix walk every line of a frame). */
static inline const char *next_newline(const char *p, const char *end)
{
    const __m128i newline = _mm_set1_epi8('\n');
    for (; p + 16 <= end; p += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        unsigned mask = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, newline));
        if (mask)
            return p + __builtin_ctz(mask);
    }
    for (; p < end; p++)
        if (*p == '\n')
            return p;
    return NULL;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define WIDE_SCANS 1

/* 64 bytes a step where the CPU has AVX2 or AVX-512BW (chosen once, at import): the block's
   newlines as one 64-bit mask, taken whole, not a newline at a time.  Only its first newline
   can end a line longer than max_line (the others are under 64 bytes apart), so a block costs
   the same whatever its lines; max_line is at least 64 here (smaller: the SSE2 scan).  On a
   flood's 240 KiB frame of ~110-byte lines (2-core box, Xeon): 20 us (SSE2) -> 12 (AVX2),
   8 (AVX-512BW). */
#define SCAN_BLOCKS(p, n, max_line, block)                                                     \
    Py_ssize_t i = 0, lines = 1, line_start = 0;                                               \
    for (; i + 64 <= n; i += 64) {                                                             \
        unsigned long long bad, nl = block(p + i, &bad);                                       \
        if (bad)                                                                               \
            return -1;                                                                         \
        if (nl) {                                                                              \
            if (i + __builtin_ctzll(nl) - line_start > max_line)                              \
                return -1;                                                                     \
            lines += __builtin_popcountll(nl);                                                 \
            line_start = i + 64 - __builtin_clzll(nl);                                         \
        }                                                                                      \
    }                                                                                          \
    return scan_rest(p, i, n, max_line, lines, line_start);

/* The newlines of p[0..64) as a mask; *bad: nonzero when one of its bytes is unsafe. */
__attribute__((target("avx2"))) static inline unsigned long long
block_avx2(const unsigned char *p, unsigned long long *bad)
{
    const __m256i space = _mm256_set1_epi8(0x20), newline = _mm256_set1_epi8('\n');
    const __m256i quote = _mm256_set1_epi8('"'), backslash = _mm256_set1_epi8('\\');
    __m256i a = _mm256_loadu_si256((const __m256i *)p);
    __m256i b = _mm256_loadu_si256((const __m256i *)(p + 32));
    __m256i nl_a = _mm256_cmpeq_epi8(a, newline), nl_b = _mm256_cmpeq_epi8(b, newline);
    /* a signed compare: below 0x20, and 0x80 and up (negative), in one */
    __m256i unsafe = _mm256_or_si256(_mm256_andnot_si256(nl_a, _mm256_cmpgt_epi8(space, a)),
                                     _mm256_andnot_si256(nl_b, _mm256_cmpgt_epi8(space, b)));
    unsafe = _mm256_or_si256(unsafe, _mm256_or_si256(_mm256_cmpeq_epi8(a, quote),
                                                     _mm256_cmpeq_epi8(a, backslash)));
    unsafe = _mm256_or_si256(unsafe, _mm256_or_si256(_mm256_cmpeq_epi8(b, quote),
                                                     _mm256_cmpeq_epi8(b, backslash)));
    *bad = (unsigned)_mm256_movemask_epi8(unsafe);
    return (unsigned long long)(unsigned)_mm256_movemask_epi8(nl_a) |
           (unsigned long long)(unsigned)_mm256_movemask_epi8(nl_b) << 32;
}

__attribute__((target("avx2,popcnt"))) static Py_ssize_t
scan_lines_avx2(const unsigned char *p, Py_ssize_t n, Py_ssize_t max_line)
{
    SCAN_BLOCKS(p, n, max_line, block_avx2)
}

__attribute__((target("avx512f,avx512bw"))) static inline unsigned long long
block_avx512(const unsigned char *p, unsigned long long *bad)
{
    __m512i v = _mm512_loadu_si512((const void *)p);
    __mmask64 nl = _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8('\n'));
    __mmask64 unsafe = _mm512_cmplt_epi8_mask(v, _mm512_set1_epi8(0x20)) & ~nl;
    unsafe |= _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8('"'));
    unsafe |= _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8('\\'));
    *bad = unsafe;
    return nl;
}

__attribute__((target("avx512f,avx512bw,popcnt"))) static Py_ssize_t
scan_lines_avx512(const unsigned char *p, Py_ssize_t n, Py_ssize_t max_line)
{
    SCAN_BLOCKS(p, n, max_line, block_avx512)
}
#endif

typedef Py_ssize_t (*scan_fn)(const unsigned char *, Py_ssize_t, Py_ssize_t);
static scan_fn wide_scan = NULL; /* set at import where the CPU has it */
static const char *scan_simd = "sse2";

static Py_ssize_t scan_lines(const unsigned char *p, Py_ssize_t n, Py_ssize_t max_line)
{
    if (wide_scan != NULL && max_line >= 64)
        return wide_scan(p, n, max_line);
    return scan_lines_sse2(p, n, max_line);
}

/* The widest scan this CPU runs; DFLASHD_SIMD=sse2 or avx2 holds it at most that (the tests
   check each against the Python reference). */
static void choose_scan(void)
{
#ifdef WIDE_SCANS
    const char *cap = getenv("DFLASHD_SIMD");
    int upto = cap == NULL ? 2 : strcmp(cap, "sse2") == 0 ? 0 : strcmp(cap, "avx2") == 0 ? 1 : 2;
    __builtin_cpu_init();
    if (upto >= 2 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512f")) {
        wide_scan = scan_lines_avx512;
        scan_simd = "avx512bw";
    } else if (upto >= 1 && __builtin_cpu_supports("avx2")) {
        wide_scan = scan_lines_avx2;
        scan_simd = "avx2";
    }
#endif
}

#else /* elsewhere: a byte loop the compiler vectorises, and memchr */

/* Nonzero when a byte of p[0..n) is unsafe.  No branch per byte: the compiler turns each
   block into a few vector compares. */
static int any_unsafe(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 64 <= n; i += 64) {
        unsigned char bad = 0;
        for (int j = 0; j < 64; j++) {
            unsigned char c = p[i + j];
            bad |= (unsigned char)(((c < 0x20) & (c != '\n')) | (c >> 7) | (c == '"') |
                                   (c == '\\'));
        }
        if (bad)
            return 1;
    }
    for (; i < n; i++)
        if (unsafe_byte(p[i]))
            return 1;
    return 0;
}

static Py_ssize_t scan_lines(const unsigned char *p, Py_ssize_t n, Py_ssize_t max_line)
{
    if (any_unsafe(p, n))
        return -1;
    Py_ssize_t lines = 1;
    const unsigned char *start = p, *end = p + n;
    const unsigned char *nl;
    while ((nl = memchr(start, '\n', (size_t)(end - start))) != NULL) {
        if (nl - start > max_line)
            return -1;
        start = nl + 1;
        lines++;
    }
    if (end - start > max_line)
        return -1;
    return lines;
}

static inline const char *next_newline(const char *p, const char *end)
{
    return memchr(p, '\n', (size_t)(end - p));
}
#endif

static PyObject *lines_scan(PyObject *self, PyObject *args)
{
    const char *data;
    Py_ssize_t n, max_line, lines;
    if (!PyArg_ParseTuple(args, "y#n:scan", &data, &n, &max_line))
        return NULL;
    if (n >= GIL_FREE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        lines = scan_lines((const unsigned char *)data, n, max_line);
        Py_END_ALLOW_THREADS
    } else {
        lines = scan_lines((const unsigned char *)data, n, max_line);
    }
    return PyLong_FromSsize_t(lines);
}

static size_t put_decimal(char *out, unsigned long long value)
{
    char digits[24];
    size_t len = 0;
    do {
        digits[len++] = (char)('0' + value % 10);
        value /= 10;
    } while (value);
    for (size_t i = 0; i < len; i++)
        out[i] = digits[len - 1 - i];
    return len;
}

#if defined(__SSE2__)
/* memcpy for the short pieces of a record or an echo line (a head, a line of ~100 bytes):
   16-byte moves, the last one overlapping the one before, never past either end.  On a
   240 KiB frame (tests/perf/codec_cost.py, 2-core box): prefix 20 -> 15 us, encode the same
   within the noise (30-32 us). */
static inline void copy_short(char *dst, const char *src, size_t n)
{
    if (n < 16 || n > 256) {
        memcpy(dst, src, n);
        return;
    }
    size_t i = 0;
    for (; i + 16 < n; i += 16)
        _mm_storeu_si128((__m128i *)(dst + i), _mm_loadu_si128((const __m128i *)(src + i)));
    _mm_storeu_si128((__m128i *)(dst + n - 16), _mm_loadu_si128((const __m128i *)(src + n - 16)));
}
/* A piece of at most 16 bytes as one 16-byte move: its source has 16 bytes to read, the
   buffer 16 bytes to spare past its end (ENCODE_SLACK), and what the move writes past the piece
   is written over by the next.  A record's seq and its closing '"}\n' went through memcpy
   calls of a few bytes, two a record. */
#define MOVE16(dst, src) _mm_storeu_si128((__m128i *)(dst), _mm_loadu_si128((const __m128i *)(src)))
#else
#define copy_short memcpy
#endif
#define ENCODE_SLACK 16

/* A fixed piece written once a line (a record's closing bytes, the echo's "r3 out | "): held
   in 16 bytes when it fits, so each line's copy is one move (MOVE16), else copy_short. */
typedef struct {
    const char *bytes;
    size_t n;
    char padded[16];
    int fits;
} Piece;

static inline void piece_init(Piece *piece, const char *bytes, size_t n)
{
    piece->bytes = bytes;
    piece->n = n;
    piece->fits = n <= 16;
    memset(piece->padded, 0, sizeof piece->padded);
    if (piece->fits)
        memcpy(piece->padded, bytes, n);
}

/* The piece at w (ENCODE_SLACK spare past it); the position after it. */
static inline char *piece_put(char *w, const Piece *piece)
{
#if defined(__SSE2__)
    if (piece->fits)
        MOVE16(w, piece->padded);
    else
#endif
        copy_short(w, piece->bytes, piece->n);
    return w + piece->n;
}

/* Fills out (large enough, and ENCODE_SLACK more) and returns the bytes written, or -1 when
   data has more or fewer than count lines. */
static Py_ssize_t encode_lines(char *out, const char *data, Py_ssize_t n, Py_ssize_t count,
                               const char *head, Py_ssize_t head_n, unsigned long long seq,
                               const char *mid, Py_ssize_t mid_n, const char *tail,
                               Py_ssize_t tail_n)
{
    char *w = out;
    const char *p = data;
    const char *end = data + n;
    /* The seq's digits are counted up in place, a carry at a time: converting each seq afresh
       (a division per digit) was most of this loop (issue 53).  Near the end of the range,
       where a seq wraps, each is converted as it always was. */
    char digits[24];
    size_t digits_n = put_decimal(digits, seq);
    Piece closing;
    piece_init(&closing, tail, (size_t)tail_n);
    const int counting = seq <= ULLONG_MAX - (unsigned long long)count;
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *nl = next_newline(p, end);
        const char *stop = nl ? nl : end;
        if ((nl == NULL) != (i == count - 1))
            return -1;
        copy_short(w, head, (size_t)head_n);
        w += head_n;
        if (counting) {
#if defined(__SSE2__)
            if (digits_n <= 16)
                MOVE16(w, digits);
            else
#endif
                memcpy(w, digits, digits_n);
            w += digits_n;
            size_t k = digits_n;
            while (k > 0 && digits[k - 1] == '9')
                digits[--k] = '0';
            if (k > 0) {
                digits[k - 1]++;
            } else { /* 99..9 + 1: one digit more */
                memmove(digits + 1, digits, digits_n++);
                digits[0] = '1';
            }
        } else {
            w += put_decimal(w, seq + (unsigned long long)i);
        }
        copy_short(w, mid, (size_t)mid_n);
        w += mid_n;
        copy_short(w, p, (size_t)(stop - p));
        w += stop - p;
        w = piece_put(w, &closing);
        p = stop + 1;
    }
    return w - out;
}

static PyObject *lines_encode(PyObject *self, PyObject *args)
{
    const char *data, *head, *mid, *tail;
    Py_ssize_t n, count, head_n, mid_n, tail_n, written;
    unsigned long long seq0;
    if (!PyArg_ParseTuple(args, "y#ny#Ky#y#:encode", &data, &n, &count, &head, &head_n, &seq0,
                          &mid, &mid_n, &tail, &tail_n))
        return NULL;
    if (count < 1) {
        PyErr_SetString(PyExc_ValueError, "count must be at least 1");
        return NULL;
    }
    Py_ssize_t per_line = head_n + mid_n + tail_n + 20; /* 20: the digits of any u64 */
    if (per_line > (PY_SSIZE_T_MAX - n - ENCODE_SLACK) / count) {
        PyErr_NoMemory();
        return NULL;
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, n + count * per_line + ENCODE_SLACK);
    if (result == NULL)
        return NULL;
    char *out = PyBytes_AS_STRING(result);
    if (n >= GIL_FREE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        written = encode_lines(out, data, n, count, head, head_n, seq0, mid, mid_n, tail, tail_n);
        Py_END_ALLOW_THREADS
    } else {
        written = encode_lines(out, data, n, count, head, head_n, seq0, mid, mid_n, tail, tail_n);
    }
    if (written < 0) {
        Py_DECREF(result);
        PyErr_SetString(PyExc_ValueError, "data does not hold count lines");
        return NULL;
    }
    if (_PyBytes_Resize(&result, written) < 0)
        return NULL;
    return result;
}

/* Fills out (large enough, and ENCODE_SLACK more): head, the line, '\n' for each line. */
static Py_ssize_t prefix_lines(char *out, const char *data, Py_ssize_t n, Py_ssize_t count,
                               const char *head, Py_ssize_t head_n)
{
    char *w = out;
    const char *p = data;
    const char *end = data + n;
    Piece prefix; /* "r3 out | ": one move, not a memcpy call a line */
    piece_init(&prefix, head, (size_t)head_n);
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *nl = next_newline(p, end);
        const char *stop = nl ? nl : end;
        if ((nl == NULL) != (i == count - 1))
            return -1;
        w = piece_put(w, &prefix);
        copy_short(w, p, (size_t)(stop - p));
        w += stop - p;
        *w++ = '\n';
        p = stop + 1;
    }
    return w - out;
}

static PyObject *lines_prefix(PyObject *self, PyObject *args)
{
    const char *data, *head;
    Py_ssize_t n, count, head_n, written;
    if (!PyArg_ParseTuple(args, "y#ny#:prefix", &data, &n, &count, &head, &head_n))
        return NULL;
    if (count < 1) {
        PyErr_SetString(PyExc_ValueError, "count must be at least 1");
        return NULL;
    }
    if (head_n + 1 > (PY_SSIZE_T_MAX - n - ENCODE_SLACK) / count) {
        PyErr_NoMemory();
        return NULL;
    }
    /* n holds count - 1 newlines: each line gets head and one '\n' */
    PyObject *result = PyBytes_FromStringAndSize(NULL, n + 1 + count * head_n + ENCODE_SLACK);
    if (result == NULL)
        return NULL;
    char *out = PyBytes_AS_STRING(result);
    if (n >= GIL_FREE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        written = prefix_lines(out, data, n, count, head, head_n);
        Py_END_ALLOW_THREADS
    } else {
        written = prefix_lines(out, data, n, count, head, head_n);
    }
    if (written != n + 1 + count * head_n) {
        Py_DECREF(result);
        PyErr_SetString(PyExc_ValueError, "data does not hold count lines");
        return NULL;
    }
    if (_PyBytes_Resize(&result, written) < 0)
        return NULL;
    return result;
}

/* Nonzero when w (k bytes) occurs in p[0..n).  Blocks of 64 start positions, no branch per
   byte (a few vector compares, as in any_unsafe): the word's first three bytes at every
   position, a hit then confirmed in full.  About 7x CPython's bytes search (a two-way search
   with a skip table) on a flood's lines: a word that is absent costs a whole pass, which is
   the common answer for "nan". */
static int has_word(const unsigned char *p, Py_ssize_t n, const unsigned char *w, Py_ssize_t k)
{
    if (k == 0)
        return 1;
    if (n < k)
        return 0;
    if (k < 3)
        return memmem(p, (size_t)n, w, (size_t)k) != NULL;
    const unsigned char a = w[0], b = w[1], c = w[2];
    const Py_ssize_t last = n - k; /* the last position a match can start at */
    Py_ssize_t i = 0;
    for (; i + 64 <= last; i += 64) {
        unsigned char hit = 0;
        for (int j = 0; j < 64; j++)
            hit |= (unsigned char)((p[i + j] == a) & (p[i + j + 1] == b) & (p[i + j + 2] == c));
        if (hit)
            for (int j = 0; j < 64; j++)
                if (p[i + j] == a && memcmp(p + i + j, w, (size_t)k) == 0)
                    return 1;
    }
    for (; i <= last; i++)
        if (p[i] == a && memcmp(p + i, w, (size_t)k) == 0)
            return 1;
    return 0;
}

static PyObject *lines_mentions(PyObject *self, PyObject *args)
{
    const char *data;
    Py_ssize_t n;
    PyObject *words;
    if (!PyArg_ParseTuple(args, "y#O!:mentions", &data, &n, &PyTuple_Type, &words))
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(words);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *word = PyTuple_GET_ITEM(words, i);
        if (!PyBytes_Check(word)) {
            PyErr_SetString(PyExc_TypeError, "mentions: words must be bytes");
            return NULL;
        }
    }
    int found = 0;
    for (Py_ssize_t i = 0; i < count && !found; i++) {
        /* the tuple holds its words (bytes are immutable): safe to read without the GIL */
        PyObject *word = PyTuple_GET_ITEM(words, i);
        const unsigned char *w = (const unsigned char *)PyBytes_AS_STRING(word);
        Py_ssize_t k = PyBytes_GET_SIZE(word);
        if (n >= GIL_FREE_BYTES) {
            Py_BEGIN_ALLOW_THREADS
            found = has_word((const unsigned char *)data, n, w, k);
            Py_END_ALLOW_THREADS
        } else {
            found = has_word((const unsigned char *)data, n, w, k);
        }
    }
    return PyBool_FromLong(found);
}

/* read_lines(fd, held, max_read, max_line) -> (text, rest, nread, count)

   One read(2) of what the pipe holds (at most max_read bytes) into a buffer that begins with
   ``held`` (the stream's bytes held back since the last read: a partial line), then the scan of
   its complete lines, in one stretch without the GIL: the drain thread's os.read and its scan
   each gave the GIL away and waited to take it back, and the framer copied the complete lines
   out of the chunk (the held bytes joined to it first).  Here the read lands where the lines
   are kept, and the frame's text is that buffer itself.
   - count > 0: text is the complete lines (scan's contract), rest the bytes after the last '\n';
   - count == 0 or -1: text is held + the chunk, whole (no '\n' in it, or the scan refused it, or
     a '\r' is in it: the framer's general path), rest is None;
   - nread == 0: end of file (text is held); an empty non-blocking fd: BlockingIOError.

   Memory (issue 53): the buffer is sized by FIONREAD, rounded up to READ_GRANULE, and the
   text's size is set, not shrunk by realloc: a shrink frees a sliver behind every frame that
   the allocator's thread cache keeps, so written frames' holes never joined and were never
   reused (the drain's arena 5.5 -> 11.5 MiB).  Slack per frame: < READ_GRANULE + a line. */
#define READ_GRANULE (4 * 1024)

static PyObject *lines_read_lines(PyObject *self, PyObject *args)
{
    int fd;
    const char *held;
    Py_ssize_t held_n, max_read, max_line;
    if (!PyArg_ParseTuple(args, "iy#nn:read_lines", &fd, &held, &held_n, &max_read, &max_line))
        return NULL;
    if (max_read < 1 || held_n > PY_SSIZE_T_MAX / 2 || max_read > PY_SSIZE_T_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "read_lines: bad sizes");
        return NULL;
    }
    /* nothing in the pipe (FIONREAD says 0): a small read, for the end of file or EAGAIN;
       what arrives meanwhile is the next read's */
    int avail = 0;
    Py_ssize_t want = max_read;
    if (ioctl(fd, FIONREAD, &avail) == 0)
        want = avail <= 0 ? READ_GRANULE : (avail < max_read ? avail : max_read);
    Py_ssize_t size = (held_n + want + READ_GRANULE - 1) / READ_GRANULE * READ_GRANULE;
    want = size - held_n;
    PyObject *data = PyBytes_FromStringAndSize(NULL, size);
    if (data == NULL)
        return NULL;
    char *buf = PyBytes_AS_STRING(data);
    memcpy(buf, held, (size_t)held_n);
    Py_ssize_t got, last_nl = -1, count = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    got = read(fd, buf + held_n, (size_t)want);
    if (got < 0) {
        err = errno;
    } else if (got > 0) {
        Py_ssize_t total = held_n + got;
        /* a '\r' anywhere: the framer's general path.  The scan refuses one before the last
           '\n' (an unsafe byte), so only the bytes after it are searched here. */
        const char *nl = memrchr(buf, '\n', (size_t)total);
        if (nl == NULL) {
            count = memchr(buf, '\r', (size_t)total) != NULL ? -1 : 0;
        } else if (memchr(nl + 1, '\r', (size_t)(buf + total - nl - 1)) != NULL) {
            count = -1;
        } else {
            last_nl = nl - buf;
            count = scan_lines((const unsigned char *)buf, last_nl, max_line);
        }
    }
    Py_END_ALLOW_THREADS
    if (got < 0) {
        Py_DECREF(data);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_ssize_t total = held_n + got;
    Py_ssize_t end = count > 0 ? last_nl : total;
    PyObject *rest = Py_None;
    if (count > 0) {
        rest = PyBytes_FromStringAndSize(buf + last_nl + 1, total - last_nl - 1);
        if (rest == NULL) {
            Py_DECREF(data);
            return NULL;
        }
    } else {
        Py_INCREF(rest);
    }
    /* ours alone (never shared, hash untaken, never a 0/1-byte singleton): size set in place */
    Py_SET_SIZE(data, end);
    buf[end] = '\0';
    return Py_BuildValue("(NNnn)", data, rest, got, count);
}

/* pending(fd) -> the bytes waiting in a pipe (FIONREAD; 0 where it cannot be asked).  Holding
   the GIL: the drain asks it after every read it hands on (its gather), and fcntl.ioctl gave the
   GIL away for a call of a microsecond, the drain then waiting tens of them to take it back
   behind the writer and the loop in a flood (issue 53). */
static PyObject *lines_pending(PyObject *self, PyObject *args)
{
    int fd, avail = 0;
    if (!PyArg_ParseTuple(args, "i:pending", &fd))
        return NULL;
    if (ioctl(fd, FIONREAD, &avail) != 0 || avail < 0)
        avail = 0;
    return PyLong_FromLong(avail);
}

/* wait_bytes(fd, bell_r, bell_w) -> 1 when the pipe fd has bytes or has no writer left (the
   drain reads next), 0 when interrupted (a signal: ask again)

   The drain's wait on its emptied pipe, without poll(2): Linux marks a pipe that was ever polled
   (pipe->poll_usage, since 5.16) and then wakes its readers' queue on every write(2), which cost a
   job printing line by line ~10 % of its own rate for the rest of the run, on every kernel
   measured (tests/perf/poll_cost.py, issue 53).  A blocking tee(2) of one byte into the drain's
   private bell pipe waits on the same queue as a blocking read does, taking nothing from the
   pipe: the bytes stay where catch_up() counts them, and the read that follows frames them.
   tee(2) honours O_NONBLOCK on either end, so the pipe's flag is cleared for the wait and set
   again after (the drain is the pipe's only reader).  The byte rung into the bell is read back.
   Without the GIL while it waits.  OSError for any other failure (EINVAL: fd is not a pipe, or a
   sandbox without tee): the caller waits with poll(2) from then on. */
static PyObject *lines_wait_bytes(PyObject *self, PyObject *args)
{
    int fd, bell_r, bell_w, err = 0;
    ssize_t got;
    if (!PyArg_ParseTuple(args, "iii:wait_bytes", &fd, &bell_r, &bell_w))
        return NULL;
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_BEGIN_ALLOW_THREADS
    got = tee(fd, bell_w, 1, 0);
    if (got < 0)
        err = errno;
    if (fcntl(fd, F_SETFL, flags) != 0 && err == 0)
        err = errno;
    if (got > 0) {
        char rung[16];
        ssize_t back;
        do {
            back = read(bell_r, rung, sizeof rung);
        } while (back < 0 && errno == EINTR);
    }
    Py_END_ALLOW_THREADS
    if (err == EINTR)
        return PyLong_FromLong(0);
    if (err != 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong(1);
}

/* write(2) of buf's n bytes to fd, again after a short write or EINTR (without the GIL): 0 when
   all were written, else the errno of the write that failed; *written: how many were. */
static int write_fully(int fd, const char *buf, Py_ssize_t n, Py_ssize_t *written)
{
    while (*written < n) {
        ssize_t got = write(fd, buf + *written, (size_t)(n - *written));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return got < 0 ? errno : EIO;
        *written += got;
    }
    return 0;
}

/* append_records(fd, dir_fd, name, dev, ino, frames, tail) -> (written, total, err)

   The writer thread's whole append of a batch of scanned frames, in one stretch without the GIL:
   the check that ``name`` (in the directory ``dir_fd``, a link not followed) still is the open
   file (``dev``, ``ino``), the records of every frame (``frames``: a tuple of
   ``(text, count, head, seq0, mid)``, each as ``encode`` takes them) into one buffer, and the
   write(2) of all of it to ``fd`` (an O_APPEND descriptor), again after a short write.  It was
   three calls, each giving the GIL away and waiting to take it back behind the drain and the
   echo: the writer, a flood's slowest thread, spent about 45 % of those calls' time off the
   CPU (issue 53).
   - err == 0: all ``total`` bytes written;
   - err > 0: the write failed with that errno after ``written`` bytes (the caller cuts them);
   - err == -1: the name no longer names the file; nothing encoded or written. */
struct frame_piece {
    const char *data, *head, *mid;
    Py_ssize_t n, count, head_n, mid_n;
    unsigned long long seq0;
};

static PyObject *lines_append_records(PyObject *self, PyObject *args)
{
    int fd, dir_fd;
    const char *name, *tail;
    Py_ssize_t name_n, tail_n;
    unsigned long long dev, ino;
    PyObject *frames;
    if (!PyArg_ParseTuple(args, "iiy#KKO!y#:append_records", &fd, &dir_fd, &name, &name_n, &dev,
                          &ino, &PyTuple_Type, &frames, &tail, &tail_n))
        return NULL;
    Py_ssize_t nframes = PyTuple_GET_SIZE(frames);
    if (nframes < 1) {
        PyErr_SetString(PyExc_ValueError, "append_records: no frames");
        return NULL;
    }
    struct frame_piece *pieces = PyMem_Malloc((size_t)nframes * sizeof(struct frame_piece));
    if (pieces == NULL)
        return PyErr_NoMemory();
    Py_ssize_t bound = 0;
    for (Py_ssize_t i = 0; i < nframes; i++) {
        struct frame_piece *f = &pieces[i];
        PyObject *item = PyTuple_GET_ITEM(frames, i);
        if (!PyTuple_Check(item)) {
            PyMem_Free(pieces);
            PyErr_SetString(PyExc_TypeError, "append_records: each frame is a tuple");
            return NULL;
        }
        /* the tuples hold their bytes (immutable): safe to read without the GIL */
        if (!PyArg_ParseTuple(item, "y#ny#Ky#:append_records", &f->data,
                              &f->n, &f->count, &f->head, &f->head_n, &f->seq0, &f->mid,
                              &f->mid_n)) {
            PyMem_Free(pieces);
            return NULL;
        }
        Py_ssize_t per_line = f->head_n + f->mid_n + tail_n + 20; /* 20: any u64's digits */
        if (f->count < 1 || per_line > (PY_SSIZE_T_MAX / 2 - f->n) / f->count ||
            f->n + f->count * per_line > PY_SSIZE_T_MAX / 2 - bound) {
            PyMem_Free(pieces);
            PyErr_SetString(PyExc_ValueError, "append_records: bad sizes");
            return NULL;
        }
        bound += f->n + f->count * per_line;
    }
    char *out = PyMem_RawMalloc((size_t)bound + ENCODE_SLACK);
    if (out == NULL) {
        PyMem_Free(pieces);
        return PyErr_NoMemory();
    }
    Py_ssize_t total = 0, written = 0;
    int err = 0, bad = 0;
    Py_BEGIN_ALLOW_THREADS
    struct stat st;
    if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        (unsigned long long)st.st_dev != dev || (unsigned long long)st.st_ino != ino) {
        err = -1;
    } else {
        for (Py_ssize_t i = 0; i < nframes && !bad; i++) {
            struct frame_piece *f = &pieces[i];
            Py_ssize_t w = encode_lines(out + total, f->data, f->n, f->count, f->head, f->head_n,
                                        f->seq0, f->mid, f->mid_n, tail, tail_n);
            if (w < 0)
                bad = 1;
            else
                total += w;
        }
        if (!bad)
            err = write_fully(fd, out, total, &written);
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(out);
    PyMem_Free(pieces);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "append_records: a frame does not hold count lines");
        return NULL;
    }
    return Py_BuildValue("(nni)", written, total, err);
}

/* EchoWriter(fd, max_bytes, max_items, note_head, note_tail): the echo of the job's output
   (``start --foreground``) on a thread of its own that never takes the GIL.

   It was a Python thread: each frame a wake-up through a queue, the GIL taken back after the
   wait and again after the C call that prefixed and wrote the frame, behind the drain and the
   log writer.  In a 2-core block flood the job wrote 932 MiB/s with that thread's hand-offs
   kept and its C call skipped, 1,152 with no echo at all, 798 with both: most of the echo's
   cost was the hand-off, not its bytes (issue 53, docs/measurements.md).  Now a drain's ``offer`` (holding the GIL) queues the frame's bytes
   object itself, kept alive by a reference, and the thread (all signals blocked) prefixes and
   writes it without Python; the references of what was written are dropped by the next
   ``offer`` or by ``close``, which hold the GIL.

   offer(data, count, head, lines) -> bool: count >= 1: data holds count lines joined by '\n'
   (a scanned frame's text), each written head + line + '\n' (head b"": the bare lines);
   count == 0: data is written as it is (an echo formatted in Python), ``lines`` of it.  False:
   dropped and counted (``dropped``), as the Python echo does: when the queue holds
   ``max_bytes`` or ``max_items`` already (a terminal slower than the job), or once the stream
   is gone.  Before the next frame written after a drop, note_head + the count + note_tail.
   close(timeout_s) -> bool: what is queued is written, then the thread ends; False when it
   did not end in time (a write blocked on a stalled terminal: it keeps what it uses). */

typedef struct EchoItem {
    struct EchoItem *next;
    PyObject *owner; /* the bytes written: a reference, dropped under the GIL once written */
    Py_ssize_t count, lines, head_n;
    char head[];
} EchoItem;

typedef struct {
    PyObject_HEAD
    int fd;
    Py_ssize_t max_bytes, max_items;
    pthread_mutex_t mu;
    pthread_cond_t wake;  /* something queued, or closing */
    pthread_cond_t ended; /* the thread finished (CLOCK_MONOTONIC) */
    EchoItem *first, *last, *done; /* queued, oldest first; written, to release */
    Py_ssize_t queued_bytes, queued_items;
    long long dropped, said;
    int closing, failed, finished, started;
    pthread_t thread;
    PyObject *note_head, *note_tail;
} EchoWriter;

/* write(2) all of it; a non-blocking stream (O_NONBLOCK set on a shared terminal) is waited
   for.  0, or the errno that ended it. */
static int write_blocking(int fd, const char *buf, Py_ssize_t n)
{
    Py_ssize_t written = 0;
    while (written < n) {
        int err = write_fully(fd, buf, n, &written);
        if (err != EAGAIN && err != EWOULDBLOCK)
            return err;
        struct pollfd want = {fd, POLLOUT, 0};
        if (poll(&want, 1, -1) < 0 && errno != EINTR)
            return errno;
    }
    return 0;
}

static int echo_item_write(EchoWriter *e, EchoItem *item, char **buf, size_t *cap)
{
    const char *data = PyBytes_AS_STRING(item->owner);
    Py_ssize_t n = PyBytes_GET_SIZE(item->owner);
    if (item->count == 0)
        return write_blocking(e->fd, data, n);
    size_t need = (size_t)(n + 1 + item->count * item->head_n + ENCODE_SLACK);
    if (need > *cap) {
        char *grown = realloc(*buf, need);
        if (grown == NULL)
            return 0; /* this frame is not echoed; the log has it */
        *buf = grown;
        *cap = need;
    }
    Py_ssize_t total = prefix_lines(*buf, data, n, item->count, item->head, item->head_n);
    return total > 0 ? write_blocking(e->fd, *buf, total) : 0;
}

static void *echo_main(void *arg)
{
    EchoWriter *e = arg;
    char *buf = NULL, note[256];
    size_t cap = 0;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (e->first == NULL && !e->closing)
            pthread_cond_wait(&e->wake, &e->mu);
        EchoItem *item = e->first;
        if (item == NULL)
            break; /* closing, and everything queued is written */
        e->first = item->next;
        if (e->first == NULL)
            e->last = NULL;
        e->queued_bytes -= PyBytes_GET_SIZE(item->owner);
        e->queued_items--;
        long long lost = e->dropped - e->said;
        e->said = e->dropped;
        int failed = e->failed;
        pthread_mutex_unlock(&e->mu);
        if (!failed && lost > 0) {
            int k = snprintf(note, sizeof note, "%s%lld%s", PyBytes_AS_STRING(e->note_head), lost,
                             PyBytes_AS_STRING(e->note_tail));
            failed = write_blocking(e->fd, note, k < (int)sizeof note ? k : (int)sizeof note - 1);
        }
        if (!failed)
            failed = echo_item_write(e, item, &buf, &cap);
        pthread_mutex_lock(&e->mu);
        e->failed = e->failed || failed != 0;
        item->next = e->done;
        e->done = item;
    }
    e->finished = 1;
    pthread_cond_broadcast(&e->ended);
    pthread_mutex_unlock(&e->mu);
    free(buf);
    return NULL;
}

static void echo_release(EchoItem *item)
{
    while (item != NULL) {
        EchoItem *next = item->next;
        Py_DECREF(item->owner);
        PyMem_RawFree(item);
        item = next;
    }
}

/* The written frames' references, dropped (the GIL held). */
static void echo_release_done(EchoWriter *e)
{
    pthread_mutex_lock(&e->mu);
    EchoItem *done = e->done;
    e->done = NULL;
    pthread_mutex_unlock(&e->mu);
    echo_release(done);
}

static int echo_init(EchoWriter *e, PyObject *args, PyObject *kwds)
{
    if (e->started) {
        PyErr_SetString(PyExc_RuntimeError, "EchoWriter: already started");
        return -1;
    }
    PyObject *head, *tail;
    if (!PyArg_ParseTuple(args, "innSS:EchoWriter", &e->fd, &e->max_bytes, &e->max_items, &head,
                          &tail))
        return -1;
    if (PyBytes_GET_SIZE(head) + PyBytes_GET_SIZE(tail) > 200) {
        PyErr_SetString(PyExc_ValueError, "EchoWriter: the note is too long");
        return -1;
    }
    Py_INCREF(head);
    Py_INCREF(tail);
    e->note_head = head;
    e->note_tail = tail;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->wake, NULL);
    pthread_cond_init(&e->ended, &attr);
    pthread_condattr_destroy(&attr);
    sigset_t all, kept;
    sigfillset(&all); /* the thread takes no signal: the daemon's handlers run on Python's */
    pthread_sigmask(SIG_BLOCK, &all, &kept);
    int err = pthread_create(&e->thread, NULL, echo_main, e);
    pthread_sigmask(SIG_SETMASK, &kept, NULL);
    if (err != 0) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    e->started = 1;
    return 0;
}

static PyObject *echo_offer(EchoWriter *e, PyObject *args)
{
    PyObject *owner;
    const char *head;
    Py_ssize_t count, head_n, lines;
    if (!PyArg_ParseTuple(args, "Sny#n:offer", &owner, &count, &head, &head_n, &lines))
        return NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(owner);
    if (e->note_head == NULL) {
        PyErr_SetString(PyExc_ValueError, "offer: the EchoWriter was not initialised");
        return NULL;
    }
    if (count < 0 || lines < 0 ||
        (count > 0 && head_n + 1 > (PY_SSIZE_T_MAX - n - ENCODE_SLACK) / count)) {
        PyErr_SetString(PyExc_ValueError, "offer: bad sizes");
        return NULL;
    }
    echo_release_done(e);
    EchoItem *item = PyMem_RawMalloc(sizeof(EchoItem) + (size_t)head_n);
    if (item == NULL)
        return PyErr_NoMemory();
    pthread_mutex_lock(&e->mu);
    int full = e->queued_items >= e->max_items || (e->queued_bytes && e->queued_bytes + n > e->max_bytes);
    if (!e->started || e->finished || e->closing || e->failed || full) {
        e->dropped += lines;
        pthread_mutex_unlock(&e->mu);
        PyMem_RawFree(item);
        Py_RETURN_FALSE;
    }
    Py_INCREF(owner);
    item->owner = owner;
    item->count = count;
    item->lines = lines;
    item->head_n = head_n;
    memcpy(item->head, head, (size_t)head_n);
    item->next = NULL;
    if (e->last != NULL)
        e->last->next = item;
    else
        e->first = item;
    e->last = item;
    e->queued_bytes += n;
    e->queued_items++;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
    Py_RETURN_TRUE;
}

static PyObject *echo_close(EchoWriter *e, PyObject *args)
{
    double timeout_s;
    if (!PyArg_ParseTuple(args, "d:close", &timeout_s))
        return NULL;
    if (!e->started)
        Py_RETURN_TRUE;
    int finished;
    Py_BEGIN_ALLOW_THREADS
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    double whole = timeout_s > 0 ? (double)(long long)timeout_s : 0;
    deadline.tv_sec += (time_t)whole;
    deadline.tv_nsec += timeout_s > 0 ? (long)((timeout_s - whole) * 1e9) : 0;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&e->mu);
    e->closing = 1;
    pthread_cond_signal(&e->wake);
    while (!e->finished && pthread_cond_timedwait(&e->ended, &e->mu, &deadline) != ETIMEDOUT)
        ;
    finished = e->finished;
    pthread_mutex_unlock(&e->mu);
    if (finished)
        pthread_join(e->thread, NULL);
    Py_END_ALLOW_THREADS
    if (finished) {
        e->started = 0;
        echo_release_done(e);
    }
    return PyBool_FromLong(finished);
}

static void echo_dealloc(EchoWriter *e)
{
    if (e->started) {
        pthread_mutex_lock(&e->mu);
        e->closing = 1;
        pthread_cond_signal(&e->wake);
        int finished = e->finished;
        pthread_mutex_unlock(&e->mu);
        if (!finished)
            return; /* its thread still writes (a stalled terminal): it keeps what it uses */
        pthread_join(e->thread, NULL);
        e->started = 0;
    }
    if (e->note_head != NULL) { /* initialised */
        echo_release(e->done);
        echo_release(e->first);
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->wake);
        pthread_cond_destroy(&e->ended);
        Py_CLEAR(e->note_head);
        Py_CLEAR(e->note_tail);
    }
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyObject *echo_counter(EchoWriter *e, void *which)
{
    long long value = 0;
    if (e->note_head != NULL) {
        pthread_mutex_lock(&e->mu);
        value = which == NULL ? e->dropped : (long long)e->queued_bytes;
        pthread_mutex_unlock(&e->mu);
    }
    return PyLong_FromLongLong(value);
}

static PyMethodDef echo_methods[] = {
    {"offer", (PyCFunction)echo_offer, METH_VARARGS,
     "offer(data, count, head, lines) -> False when dropped (counted)."},
    {"close", (PyCFunction)echo_close, METH_VARARGS,
     "close(timeout_s) -> True once what was queued is written and the thread ended."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef echo_getset[] = {
    {"dropped", (getter)echo_counter, NULL, "Lines dropped (offered while full, or gone).", NULL},
    {"queued_bytes", (getter)echo_counter, NULL, "Bytes queued, not yet written.", "q"},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject EchoWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dflashd.logs._lines.EchoWriter",
    .tp_basicsize = sizeof(EchoWriter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The echo's writer thread, without the GIL.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)echo_init,
    .tp_dealloc = (destructor)echo_dealloc,
    .tp_methods = echo_methods,
    .tp_getset = echo_getset,
};

static PyMethodDef lines_methods[] = {
    {"wait_bytes", lines_wait_bytes, METH_VARARGS,
     "wait_bytes(fd, bell_r, bell_w) -> 1 once the pipe has bytes or no writer, 0 if interrupted."},
    {"pending", lines_pending, METH_VARARGS,
     "pending(fd) -> the bytes waiting in the pipe (FIONREAD), asked holding the GIL."},
    {"scan", lines_scan, METH_VARARGS,
     "scan(data, max_line) -> the number of JSON-safe lines in data, or -1."},
    {"encode", lines_encode, METH_VARARGS,
     "encode(data, count, head, seq0, mid, tail) -> head+seq+mid+line+tail per line."},
    {"prefix", lines_prefix, METH_VARARGS,
     "prefix(data, count, head) -> head+line+'\\n' per line."},
    {"read_lines", lines_read_lines, METH_VARARGS,
     "read_lines(fd, held, max_read, max_line) -> (text, rest, nread, count): read and scan."},
    {"append_records", lines_append_records, METH_VARARGS,
     "append_records(fd, dir_fd, name, dev, ino, frames, tail) -> (written, total, err)."},
    {"mentions", lines_mentions, METH_VARARGS,
     "mentions(data, words) -> True when one of the words occurs in data."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef lines_module = {
    PyModuleDef_HEAD_INIT, "_lines",
    "The log path's inner loops (scan, encode, prefix, mentions) in C; logs/linecodec.py is the reference.", -1,
    lines_methods,
};

PyMODINIT_FUNC PyInit__lines(void)
{
#if defined(__SSE2__)
    choose_scan();
#else
    const char *scan_simd = "none";
#endif
    if (PyType_Ready(&EchoWriterType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&lines_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&EchoWriterType);
    if (PyModule_AddStringConstant(module, "simd", scan_simd) < 0 ||
        PyModule_AddObject(module, "EchoWriter", (PyObject *)&EchoWriterType) < 0) {
        Py_DECREF(&EchoWriterType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
