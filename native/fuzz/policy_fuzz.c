/* libFuzzer harness for the tuner plugin's policy validation and acceptance.
 *
 * The plugin's own code is compiled in (its functions are static), so what is
 * fuzzed is exactly what a rank runs on a copy of the policy: decoding and
 * validating a policy image, judging a new entry against the held one at some
 * collective index, and answering getCollInfo with the result. An input is
 *
 *   [comm id: 8][index: 8][flags: 1][policy image A ...][policy image B ...]
 *
 * split in the middle: A becomes the held entry (if it decodes), B is judged
 * against it. Flag bits 0 and 1 give A and B a correct checksum, so that
 * mutations reach past the checksum check. Any fault, overflow or undefined
 * behaviour (AddressSanitizer, UBSan) is a crash. */
#include "../tuner/plugin.c"

static void hz_fuzz_image(struct hz_ctx* c, const uint8_t* data, size_t size, int fix) {
  memset(c->image, 0, sizeof c->image);
  memcpy(c->image, data, size < sizeof c->image ? size : sizeof c->image);
  if (fix) hz_st32((uint8_t*)c->image + HZP_OFF_CHECKSUM, hz_policy_checksum((uint8_t*)c->image));
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static struct hz_ctx* c;
  if (c == NULL) c = malloc(sizeof *c);
  if (size < 17) return 0;
  uint64_t comm, n;
  memcpy(&comm, data, 8);
  memcpy(&n, data + 8, 8);
  uint8_t flags = data[16];
  data += 17;
  size -= 17;
  memset(c, 0, sizeof *c);
  c->map_guard = -1;
  c->defer_at = HZ_NO_INDEX;
  c->comm_id = comm;
  c->channels_ok = (flags >> 2) & 1;
  /* Nowhere to attach stats or map a policy: the harness touches no files. */
  snprintf(c->dir, sizeof c->dir, "/nonexistent/hz-fuzz");
  snprintf(c->job, sizeof c->job, "fuzz");
  snprintf(c->policy_path, sizeof c->policy_path, "/nonexistent/hz-fuzz/fuzz/policy");

  size_t half = size / 2;
  struct hz_entry held, next;
  hz_fuzz_image(c, data, half, flags & 1);
  if (hz_decode(c, &held)) hz_take(c, &held);
  hz_fuzz_image(c, data + half, size - half, (flags >> 1) & 1);
  if (hz_decode(c, &next)) hz_judge(c, &next, n);
  if (c->defer_at <= n) hz_judge(c, &c->cand, n);

  /* Answer as getCollInfo would, short of a rank that must wait for an outcome. */
  c->n = n % HZ_RECHECK_EVERY == 0 ? n + 1 : n; /* no index-tied recheck: no files */
  if (c->held.listed && c->held.pending && c->n >= c->held.at) return 0;
  static const size_t sizes[] = {0, 4096, 1u << 20, (size_t)1 << 33};
  for (int coll = 0; coll < 6; coll++) {
    for (unsigned s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
      float table[7 * 3];
      for (int i = 0; i < 21; i++) table[i] = (float)(i % 5) - 1.0f;
      int channels = (int)(flags >> 3);
      if (c->n % HZ_RECHECK_EVERY == 0) c->n++;
      if (c->held.listed && c->held.pending && c->n >= c->held.at) return 0;
      hz_collinfo(c, coll, sizes[s], (float**)table, 7, 3, &channels);
      if (channels > HZ_MAX_CHANNELS && channels > (int)(flags >> 3)) __builtin_trap();
    }
  }
  return 0;
}
