import type * as Console from "effect/Console"
import * as Effect from "effect/Effect"

/** Terminal escapes (colours, bold): help written to a pipe or a file carries none. */
const ansiEscape = new RegExp(`${String.fromCharCode(27)}\\[[0-9;]*m`, "g")

/**
 * Lines of the CLI library's help that say nothing a reader needs: the generic description of
 * each argument's type ("A user-defined piece of text."), printed above the argument's own.
 */
const genericTypeLines = new Set([
  "A user-defined piece of text.",
  "A true or false value.",
  "An integer.",
  "A floating point number.",
  "A file without a specified path.",
  "A directory without a specified path.",
  "A path to a file.",
  "A path to a directory."
])

const isHelp = (text: string) => /(^|\n)USAGE\n/.test(text)

/**
 * Help as a person reads it: without escapes where stdout is not a terminal (or NO_COLOR is set),
 * without the generic type lines, and with each command's description on a line of its own
 * rather than after a column padded to the longest usage line.
 */
export const tidyHelp = (text: string, colour: boolean): string => {
  const plain = colour ? text : text.replace(ansiEscape, "")
  if (!isHelp(plain.replace(ansiEscape, ""))) return plain
  const lines: Array<string> = []
  const source = plain.split("\n")
  for (let index = 0; index < source.length; index++) {
    const line = source[index]!
    if (genericTypeLines.has(line.replace(ansiEscape, "").trim())) {
      // The blank line that followed it goes too.
      if (source[index + 1]?.trim() === "") index++
      continue
    }
    const command = /^( {2}- .*?\S) {3,}(\S.*)$/.exec(line)
    if (command !== null) lines.push(command[1]!, `      ${command[2]!}`)
    else lines.push(line)
  }
  return lines.join("\n")
}

/** Runs `effect` with a console whose help output is tidied (see `tidyHelp`). */
export const withTidyHelp = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.flatMap(Effect.console, (console) => {
    const colour = process.stdout.isTTY === true && process.env.NO_COLOR === undefined
    const tidy = (args: ReadonlyArray<unknown>) =>
      args.map((arg) => (typeof arg === "string" ? tidyHelp(arg, colour) : arg))
    const tidied: Console.Console = {
      ...console,
      log: (...args) => console.log(...tidy(args)),
      error: (...args) => console.error(...tidy(args))
    }
    return Effect.withConsole(effect, tidied)
  })
