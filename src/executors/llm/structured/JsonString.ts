/**
 * The inside of a JSON string, byte by byte: where a string stands after each byte (a substate),
 * shared by the grammar machine and by the vocabulary, which sorts every token once per substate
 * into those that stay inside a string and those that close it.
 *
 * Raw characters are valid UTF-8 at or above U+0020 (a token may end inside a character: the
 * substate remembers what the next byte must be); escapes are `\" \\ \/ \b \f \n \r \t \uXXXX`,
 * where XXXX is not a surrogate (D800–DFFF), so the text decodes to well-formed Unicode.
 */

export const stringPlain = 0
const afterBackslash = 1
/** After `\u`, then after one, two, three hex digits; after `\uD` (the next must be 0-7). */
const hex0 = 2
const hex1 = 3
const hex2 = 4
const hex3 = 5
const hex1AfterD = 6
/** UTF-8: one continuation byte to come; two (the first A0-BF, 80-9F, any); three (90-BF, any, 80-8F). */
const continuation1 = 7
const afterE0 = 8
const afterED = 9
const continuation2 = 10
const afterF0 = 11
const continuation3 = 12
const afterF4 = 13

export const stringSubstates = 14
/** What `stringNext` answers for a byte that closes the string, and for a byte it refuses. */
export const stringClosed = 254
export const stringRefused = 255

/** `next[substate * 256 + byte]`: the substate after the byte, stringClosed or stringRefused. */
const next = (() => {
  const table = new Uint8Array(stringSubstates * 256).fill(stringRefused)
  const set = (from: number, low: number, high: number, to: number) => {
    for (let byte = low; byte <= high; byte++) table[from * 256 + byte] = to
  }
  set(stringPlain, 0x20, 0x7f, stringPlain)
  set(stringPlain, 0x22, 0x22, stringClosed)
  set(stringPlain, 0x5c, 0x5c, afterBackslash)
  set(stringPlain, 0xc2, 0xdf, continuation1)
  set(stringPlain, 0xe0, 0xe0, afterE0)
  set(stringPlain, 0xe1, 0xec, continuation2)
  set(stringPlain, 0xed, 0xed, afterED)
  set(stringPlain, 0xee, 0xef, continuation2)
  set(stringPlain, 0xf0, 0xf0, afterF0)
  set(stringPlain, 0xf1, 0xf3, continuation3)
  set(stringPlain, 0xf4, 0xf4, afterF4)
  for (const c of '"\\/bfnrt') set(afterBackslash, c.charCodeAt(0), c.charCodeAt(0), stringPlain)
  set(afterBackslash, 0x75, 0x75, hex0)
  const hex = (from: number, to: number) => {
    set(from, 0x30, 0x39, to)
    set(from, 0x41, 0x46, to)
    set(from, 0x61, 0x66, to)
  }
  hex(hex0, hex1)
  set(hex0, 0x44, 0x44, hex1AfterD)
  set(hex0, 0x64, 0x64, hex1AfterD)
  set(hex1AfterD, 0x30, 0x37, hex2)
  hex(hex1, hex2)
  hex(hex2, hex3)
  hex(hex3, stringPlain)
  set(continuation1, 0x80, 0xbf, stringPlain)
  set(afterE0, 0xa0, 0xbf, continuation1)
  set(afterED, 0x80, 0x9f, continuation1)
  set(continuation2, 0x80, 0xbf, continuation1)
  set(afterF0, 0x90, 0xbf, continuation2)
  set(continuation3, 0x80, 0xbf, continuation2)
  set(afterF4, 0x80, 0x8f, continuation2)
  return table
})()

export const stringNext = (substate: number, byte: number): number => next[substate * 256 + byte]!

/** The shortest bytes that finish the character or escape under way (the closing quote not included). */
export const stringCompletion: ReadonlyArray<ReadonlyArray<number>> = (() => {
  const bytes = (text: string) => Array.from(text, (c) => c.charCodeAt(0))
  const completion: Array<ReadonlyArray<number>> = []
  completion[stringPlain] = []
  completion[afterBackslash] = bytes("n")
  completion[hex0] = bytes("0020")
  completion[hex1] = bytes("020")
  completion[hex1AfterD] = bytes("000")
  completion[hex2] = bytes("20")
  completion[hex3] = bytes("0")
  completion[continuation1] = [0x80]
  completion[afterE0] = [0xa0, 0x80]
  completion[afterED] = [0x80, 0x80]
  completion[continuation2] = [0x80, 0x80]
  completion[afterF0] = [0x90, 0x80, 0x80]
  completion[continuation3] = [0x80, 0x80, 0x80]
  completion[afterF4] = [0x80, 0x80, 0x80]
  return completion
})()

/** How a token's bytes fare inside a string: where it ends, or where it closes the string. */
export type StringScan =
  | { readonly kind: "inside"; readonly substate: number }
  /** The byte at `at` is the closing quote. */
  | { readonly kind: "closed"; readonly at: number }
  | { readonly kind: "refused" }

export const scanString = (substate: number, bytes: Uint8Array): StringScan => {
  let state = substate
  for (let i = 0; i < bytes.length; i++) {
    state = next[state * 256 + bytes[i]!]!
    if (state === stringClosed) return { kind: "closed", at: i }
    if (state === stringRefused) return { kind: "refused" }
  }
  return { kind: "inside", substate: state }
}
