/**
 * The phases of the byte-level JSON machine's frames (JsonMachine.ts), which its shortest
 * completions (Completions.ts) read too.
 */

/** Object phases: after `{`; in a key; after a key; after `:`; after `: `; after a value; after `,`; after `, `. */
export const open = 0
export const key = 1
export const colon = 2
export const valueSpace = 3
export const value = 4
export const afterValue = 5
export const nextSpace = 6
export const nextKey = 7
/** Array phases (after `[` is `open`): after a value, after `,`, after `, `. */
export const arrayAfterValue = 1
export const arrayNextSpace = 2
export const arrayNextValue = 3
/** Number phases: after `-`; `0`; integer digits; after `.`; fraction digits; after `e`; after its sign; its digits. */
export const minus = 0
export const zero = 1
export const integerDigits = 2
export const dot = 3
export const fractionDigits = 4
export const exponent = 5
export const exponentSign = 6
export const exponentDigits = 7

export const char = (c: string) => c.charCodeAt(0)
export const isDigit = (byte: number) => byte >= 0x30 && byte <= 0x39
