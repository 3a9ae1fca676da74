import { describe, expect, it } from "vitest"
import { unlimitedAdmission } from "../../../src/control/app-manager/Admission.js"
import {
  admissionLimits,
  appNamePattern,
  appShare,
  defaultQueueTimeoutMs,
  reservedAppNames
} from "../../../src/control/app-manager/AppRegistration.js"

describe("AppRegistration", () => {
  it("leaves an app unlimited when neither it nor its registration sets a concurrency", () => {
    expect(admissionLimits(undefined, undefined)).toBe(unlimitedAdmission)
    expect(admissionLimits({ maxQueue: 5 }, { queueTimeoutMs: 1_000 })).toBe(unlimitedAdmission)
  })

  it("takes the registration's admission settings over the app's own, field by field", () => {
    expect(admissionLimits({ maxConcurrency: 4, maxQueue: 8, queueTimeoutMs: 2_000 }, { maxConcurrency: 2 })).toEqual({
      maxConcurrency: 2,
      maxQueue: 8,
      queueTimeoutMs: 2_000
    })
    expect(admissionLimits({ maxConcurrency: 4 }, undefined)).toEqual({
      maxConcurrency: 4,
      maxQueue: 0,
      queueTimeoutMs: defaultQueueTimeoutMs
    })
  })

  it("weighs an app 1 on shared tasks unless it or its registration says otherwise", () => {
    expect(appShare("chat", undefined, undefined)).toEqual({ app: "chat", weight: 1 })
    expect(appShare("chat", { weight: 3, maxCallsPerTask: 10 }, { weight: 2 })).toEqual({
      app: "chat",
      weight: 2,
      maxCallsPerTask: 10
    })
  })

  it("refuses names that are not names, and the gateway's own", () => {
    expect(appNamePattern.test("color_chat-2")).toBe(true)
    expect(appNamePattern.test("-leading")).toBe(false)
    expect(appNamePattern.test("has space")).toBe(false)
    expect(appNamePattern.test("a".repeat(64))).toBe(false)
    expect(reservedAppNames.has("logs")).toBe(true)
  })
})
