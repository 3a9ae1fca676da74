import { describe, expect, it } from "vitest"
import { appMessageLimitBytes } from "../../../src/app-runtime/driver/protocol.js"
import {
  ChannelBudget,
  channelBytesPerSecond,
  channelRateExceeded,
  channelRateOf
} from "../../../src/control/app-manager/ChannelBudget.js"

const MiB = 1024 * 1024

/** A budget on a clock the test moves. */
const budgetAt = (rate = { bytesPerSecond: 10 * MiB, burstBytes: 20 * MiB }) => {
  let now = 0
  const budget = new ChannelBudget(rate, () => now)
  return { budget, pass: (ms: number) => (now += ms) }
}

describe("an app's channel budget", () => {
  it("takes two of the app's largest messages at once, at 8 MiB a second on average", () => {
    const rate = channelRateOf(64 * MiB)
    expect(rate).toEqual({ bytesPerSecond: channelBytesPerSecond, burstBytes: 2 * appMessageLimitBytes(64 * MiB) })
    const { budget } = budgetAt(rate)
    expect(budget.spend(appMessageLimitBytes(64 * MiB))).toBe(true)
    expect(budget.spend(appMessageLimitBytes(64 * MiB))).toBe(true)
    expect(budget.spend(1)).toBe(false)
    expect(channelRateExceeded(rate)).toBe(
      "the app's process wrote to its channel faster than its bound of 8 MiB a second (258 MiB at once) beyond what it was sent"
    )
  })

  it("refills at its rate up to its burst, and takes on top what the platform sent", () => {
    const { budget, pass } = budgetAt()
    expect(budget.spend(20 * MiB)).toBe(true)
    expect(budget.spend(1)).toBe(false)
    pass(500)
    expect(budget.spend(5 * MiB)).toBe(true)
    expect(budget.spend(1)).toBe(false)
    budget.credit(3 * MiB)
    expect(budget.spend(3 * MiB)).toBe(true)
    pass(60_000)
    expect(budget.spend(20 * MiB + 1)).toBe(false)
    budget.credit(100 * MiB)
    expect(budget.spend(20 * MiB + 1)).toBe(false)
    expect(budget.spend(20 * MiB)).toBe(true)
  })

  it("lets a steady stream below its rate run for ever", () => {
    const { budget, pass } = budgetAt()
    for (let second = 0; second < 3_600; second++) {
      expect(budget.spend(9 * MiB)).toBe(true)
      pass(1_000)
    }
  })
})
