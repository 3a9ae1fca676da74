/**
 * Names that no two things share: a name asked for is given as it is when it is free, else with the
 * next free suffix (`NAME_2`, `NAME_3`, …). Each base name remembers the suffix it reached, so that n
 * names asked for, however many collide, cost O(n) look-ups: a suffix found taken is one some other
 * name holds, and each taken name stops at most one base's count (its own, the text before its last
 * `_`). Without the memory, n colliding names cost n²/2.
 */
export class UniqueNames {
  private readonly taken: Set<string>
  private readonly nextSuffix = new Map<string, number>()

  /** `reserved`: names taken from the start, never given. */
  constructor(reserved: Iterable<string> = []) {
    this.taken = new Set(reserved)
  }

  /** `base` when it is free, else `base_N` for the least N from 2 up that no name has taken; taken from now on. */
  take(base: string): string {
    let unique = base
    if (this.taken.has(base)) {
      let suffix = this.nextSuffix.get(base) ?? 2
      unique = `${base}_${suffix}`
      while (this.taken.has(unique)) unique = `${base}_${++suffix}`
      this.nextSuffix.set(base, suffix + 1)
    }
    this.taken.add(unique)
    return unique
  }
}
