import { afterEach, beforeEach, describe, expect, it, vi } from "vitest"
import { AppLog, type AppLogLimits } from "../../../src/control/app-manager/AppLog.js"

const limits: AppLogLimits = {
  maxLineChars: 20,
  tailChars: 100,
  forwardCharsPerSecond: 100,
  forwardBurstChars: 200
}

const makeLog = () => {
  const shown: Array<string> = []
  const log = new AppLog("echo", (line) => shown.push(line), limits)
  return { log, shown, out: log.reader() }
}

describe("AppLog", () => {
  beforeEach(() => {
    vi.useFakeTimers()
  })
  afterEach(() => {
    vi.useRealTimers()
  })

  it("cuts the app's output into lines across chunks, a character split between chunks included", () => {
    const { log, shown, out } = makeLog()
    const accented = Buffer.from("café\n")
    out.write(Buffer.from("hel"))
    out.write(Buffer.from("lo\nwor"))
    out.write(accented.subarray(0, 4))
    out.write(accented.subarray(4))
    out.write(Buffer.from("last"))
    out.end()
    expect(shown).toEqual(["[app echo] hello", "[app echo] worcafé", "[app echo] last"])
    expect(log.tail()).toBe("hello\nworcafé\nlast\n")
  })

  it("cuts a line at the bound and drops the rest of it", () => {
    const { shown, out } = makeLog()
    out.write(Buffer.from(`${"a".repeat(15)}`))
    out.write(Buffer.from(`${"b".repeat(50)}\nnext\n`))
    expect(shown).toEqual([`[app echo] ${"a".repeat(15)}${"b".repeat(5)}… (cut)`, "[app echo] next"])
  })

  it("escapes what would let a line pass for another: control characters, carriage returns, line separators", () => {
    const { shown, out } = makeLog()
    out.write(Buffer.from("ok\r\u001b[2Kforged\u2028x\r\n"))
    expect(shown).toEqual(["[app echo] ok\\u000d\\u001b[2Kforged\\u2028x"])
  })

  it("keeps only the last lines, up to its bound", () => {
    const { log, out } = makeLog()
    for (let line = 0; line < 50; line++) out.write(Buffer.from(`line ${line}\n`))
    const tail = log.tail()
    expect(tail.length).toBeLessThanOrEqual(limits.tailChars)
    expect(tail.endsWith("line 49\n")).toBe(true)
    expect(tail).not.toContain("line 0\n")
  })

  it("shows lines at a bounded rate, says how many it held back, and shows lines again once the rate allows", () => {
    const { shown, out } = makeLog()
    // 19 characters shown per line ("[app echo] line NN" and its newline): a burst of 200 shows 10.
    for (let line = 10; line < 40; line++) out.write(Buffer.from(`line ${line}\n`))
    expect(shown).toHaveLength(10)
    vi.advanceTimersByTime(1_000)
    expect(shown.at(-1)).toMatch(/^\[app echo\] \(20 more line\(s\) not shown here/)
    out.write(Buffer.from("after\n"))
    expect(shown.at(-1)).toBe("[app echo] after")
  })
})
