import { isIPv4 } from "node:net"
import { describe, expect, it } from "vitest"
import {
  interfaceAddresses,
  isPublicAddress,
  nonPublicReason
} from "../../../../src/executors/common/media/PublicAddress.js"

/** The host part of a URL as the WHATWG parser (and so the media fetcher) normalizes it. */
const hostOf = (url: string) => new URL(url).hostname

/** The IPv6 forms that stand for an IPv4 address (IPv4-mapped, IPv4-translated, NAT64), as written and as a URL's host. */
const ipv6Forms = (ipv4: string): ReadonlyArray<string> =>
  [`::ffff:${ipv4}`, `::ffff:0:${ipv4}`, `64:ff9b::${ipv4}`].flatMap((form) => [form, hostOf(`http://[${form}]/`)])

/** The eight groups of an IPv6 address written without an embedded IPv4 address. */
const groupsOf = (address: string): ReadonlyArray<number> => {
  const [head, tail] = address.includes("::") ? address.split("::") : [address, undefined]
  const left = head ? head.split(":") : []
  const right = tail ? tail.split(":") : []
  const zeros = tail === undefined ? [] : new Array<string>(8 - left.length - right.length).fill("0")
  return [...left, ...zeros, ...right].map((group) => Number.parseInt(group, 16))
}

/** The first and the last address of a block. */
const ends = (block: string): ReadonlyArray<string> => {
  const [network, prefix] = block.split("/") as [string, string]
  const v4 = isIPv4(network)
  const first = v4
    ? network.split(".").reduce((value, part) => (value << 8n) | BigInt(part), 0n)
    : groupsOf(network).reduce((value, group) => (value << 16n) | BigInt(group), 0n)
  const last = first | ((1n << BigInt((v4 ? 32 : 128) - Number(prefix))) - 1n)
  const text = (value: bigint) =>
    v4
      ? [24n, 16n, 8n, 0n].map((shift) => (value >> shift) & 0xffn).join(".")
      : [112n, 96n, 80n, 64n, 48n, 32n, 16n, 0n].map((shift) => ((value >> shift) & 0xffffn).toString(16)).join(":")
  return [text(first), text(last)]
}

describe("the media fetcher's address policy", () => {
  it("accepts public unicast addresses, IPv4 and IPv6", () => {
    for (const address of ["8.8.8.8", "1.1.1.1", "151.101.1.69", "2606:4700:4700::1111", "2a00:1450:4001:82f::200e"]) {
      expect(nonPublicReason(address), address).toBeUndefined()
    }
  })

  it.each([
    ["loopback", "127.0.0.1"],
    ["loopback, elsewhere in 127/8", "127.45.6.7"],
    ["this network", "0.0.0.0"],
    ["private 10/8", "10.1.2.3"],
    ["private 172.16/12", "172.31.255.1"],
    ["private 192.168/16", "192.168.1.1"],
    ["carrier-grade NAT", "100.64.0.1"],
    ["link-local (cloud metadata)", "169.254.169.254"],
    ["IETF protocol assignments 192.0.0.0/24", "192.0.0.1"],
    ["benchmarking 198.18.0.0/15", "198.18.0.1"],
    ["benchmarking, upper half", "198.19.255.255"],
    ["documentation", "203.0.113.9"],
    ["multicast", "224.0.0.251"],
    ["reserved and broadcast", "255.255.255.255"]
  ])("refuses IPv4 %s (%s)", (_, address) => {
    expect(isPublicAddress(address)).toBe(false)
  })

  it.each([
    ["loopback", "::1"],
    ["unspecified", "::"],
    ["IPv4-compatible loopback, as written", "::127.0.0.1"],
    ["IPv4-compatible loopback, as the URL parser writes it", hostOf("http://[::127.0.0.1]/")],
    ["IPv4-compatible link-local", "::a9fe:a9fe"],
    ["IPv4-mapped loopback, dotted", "::ffff:127.0.0.1"],
    ["IPv4-mapped loopback, as the URL parser writes it", hostOf("http://[::ffff:127.0.0.1]/")],
    ["IPv4-mapped private", "::ffff:c0a8:101"],
    ["NAT64 of link-local", "64:ff9b::a9fe:a9fe"],
    ["NAT64 of a private address, dotted", "64:ff9b::10.0.0.1"],
    ["local-use NAT64", "64:ff9b:1::8.8.8.8"],
    ["6to4 of link-local", "2002:a9fe:a9fe::1"],
    ["6to4 of loopback", "2002:7f00:1::"],
    ["Teredo with an obfuscated private client", "2001:0:4136:e378:8000:63bf:3fff:fdfe"],
    ["Teredo with a private server", "2001:0:a00:1::1"],
    ["unique local", "fd12:3456:789a::1"],
    ["link-local", "fe80::1"],
    ["link-local with a zone", "fe80::1%eth0"],
    ["site-local", "fec0::1"],
    ["multicast", "ff02::1"],
    ["documentation", "2001:db8::1"],
    ["IPv4-translated loopback", "::ffff:0:127.0.0.1"],
    ["IPv4-translated private, as the URL parser writes it", hostOf("http://[::ffff:0:10.0.0.1]/")],
    ["IPv4-translated link-local, hex", "::ffff:0:a9fe:a9fe"],
    ["benchmarking 2001:2::/48", "2001:2::1"],
    ["benchmarking, its last address", "2001:2:0:ffff:ffff:ffff:ffff:ffff"],
    ["documentation 3fff::/20", "3fff::1"],
    ["documentation 3fff::/20, its last /32", "3fff:fff::1"],
    ["SRv6 SIDs 5f00::/16", "5f00::1"],
    ["discard-only", "100::1"],
    ["dummy prefix", "100:0:0:1::1"],
    ["IETF protocol assignments 2001::/23 (PCP anycast)", "2001:1::1"],
    ["AMT 2001:3::/32", "2001:3::1"],
    ["ORCHIDv2", "2001:20::1"],
    ["AS112 direct delegation", "2620:4f:8000::1"],
    ["6to4 of a private address", "2002:c0a8:101::1"],
    ["6to4 of carrier-grade NAT", "2002:6440:1::1"],
    ["IPv4-compatible private", "::10.0.0.1"],
    ["IPv4-compatible public (deprecated form, no longer routed)", "::8.8.8.8"],
    ["NAT64 outside its /96", "64:ff9b:0:1::808:808"],
    ["reserved by the IETF, outside global unicast", "4000::1"],
    ["unique local, fc00::/8 half", "fc00::1"],
    ["link-local, its far end", "febf::1"]
  ])("refuses IPv6 %s (%s)", (_, address) => {
    expect(nonPublicReason(address)).toBeDefined()
  })

  it("names the embedded IPv4 address it refuses", () => {
    expect(nonPublicReason("64:ff9b::a9fe:a9fe")).toContain("169.254.169.254")
    expect(nonPublicReason("2002:a9fe:a9fe::1")).toContain("169.254.169.254")
  })

  it("names the IPv4 address inside an IPv4-translated address", () => {
    expect(nonPublicReason("::ffff:0:127.0.0.1")).toContain("127.0.0.1")
    expect(nonPublicReason("::ffff:0:c0a8:101")).toContain("192.168.1.1")
  })

  it.each([
    ["AS112 DNS sinks", "192.31.196.1"],
    ["AMT relays", "192.52.193.1"],
    ["AS112 direct delegation", "192.175.48.1"]
  ])("refuses IPv4 special-purpose %s (%s)", (_, address) => {
    expect(isPublicAddress(address)).toBe(false)
  })

  it("accepts public addresses next to the special blocks", () => {
    for (const address of ["2001:4860:4860::8888", "2001:200::1", "3ffe::1", "3fff:1000::1", "2620:4f:8001::1"]) {
      expect(nonPublicReason(address), address).toBeUndefined()
    }
  })

  it("accepts transition forms of public IPv4 addresses", () => {
    expect(nonPublicReason("::ffff:0:8.8.8.8")).toBeUndefined()
    expect(nonPublicReason("::ffff:8.8.8.8")).toBeUndefined()
    expect(nonPublicReason("64:ff9b::808:808")).toBeUndefined()
    expect(nonPublicReason("2002:808:808::1")).toBeUndefined()
  })

  it("refuses every address of this host's own interfaces, and each IPv4 one in its IPv6 forms", () => {
    const own = interfaceAddresses()
    expect(own.length).toBeGreaterThan(0)
    for (const address of own) expect(isPublicAddress(address), address).toBe(false)
    for (const address of own.filter((address) => isIPv4(address))) {
      for (const form of ipv6Forms(address)) expect(isPublicAddress(form), form).toBe(false)
    }
  })

  it("refuses a public address of this host however it is written: IPv4-mapped, IPv4-translated, NAT64, 6to4", () => {
    const own = ["8.8.4.4", "2606:4700:4700::64"]
    for (const form of [
      "8.8.4.4",
      "::ffff:8.8.4.4",
      "::ffff:808:404",
      "[::ffff:808:404]",
      "::FFFF:0:8.8.4.4",
      "::ffff:0:808:404",
      "64:ff9b::8.8.4.4",
      "64:ff9b:0:0:0:0:808:404",
      "2002:808:404::1",
      "2606:4700:4700:0:0:0:0:64",
      "2606:4700:4700::64%eth0"
    ]) {
      expect(nonPublicReason(form, own), form).toMatch(/address of this host/)
    }
    expect(nonPublicReason("::ffff:808:404", own)).toContain("stands for 8.8.4.4")
    // Its neighbours are not the host's.
    for (const other of ["8.8.8.8", "::ffff:8.8.8.8", "64:ff9b::8.8.8.8", "2002:808:808::1", "2606:4700:4700::65"]) {
      expect(nonPublicReason(other, own), other).toBeUndefined()
    }
  })

  // IANA's IPv4 Special-Purpose Address Registry (RFC 6890 and its updates), and multicast.
  it.each([
    "0.0.0.0/8",
    "0.0.0.0/32",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.0.0/29",
    "192.0.0.8/32",
    "192.0.0.9/32",
    "192.0.0.10/32",
    "192.0.0.170/32",
    "192.0.0.171/32",
    "192.0.2.0/24",
    "192.31.196.0/24",
    "192.52.193.0/24",
    "192.88.99.0/24",
    "192.88.99.2/32",
    "192.168.0.0/16",
    "192.175.48.0/24",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "240.0.0.0/4",
    "255.255.255.255/32",
    "224.0.0.0/4"
  ])("refuses the whole of the IPv4 special-purpose block %s, and it in IPv6 forms", (block) => {
    for (const address of ends(block)) {
      for (const form of [address, ...ipv6Forms(address)]) expect(nonPublicReason(form, []), form).toBeDefined()
    }
  })

  // IANA's IPv6 Special-Purpose Address Registry, and multicast; the blocks that stand for IPv4
  // addresses (IPv4-mapped, NAT64's well-known prefix, 6to4) are judged by them, above.
  it.each([
    "::1/128",
    "::/128",
    "64:ff9b:1::/48",
    "100::/64",
    "100:0:0:1::/64",
    "2001::/23",
    "2001::/32",
    "2001:1::1/128",
    "2001:1::2/128",
    "2001:1::3/128",
    "2001:2::/48",
    "2001:3::/32",
    "2001:4:112::/48",
    "2001:10::/28",
    "2001:20::/28",
    "2001:30::/28",
    "2001:db8::/32",
    "2620:4f:8000::/48",
    "3fff::/20",
    "5f00::/16",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8"
  ])("refuses the whole of the IPv6 special-purpose block %s", (block) => {
    for (const address of ends(block)) expect(nonPublicReason(address, []), address).toBeDefined()
  })

  it("refuses what is not an IP address literal", () => {
    expect(isPublicAddress("example.com")).toBe(false)
    expect(isPublicAddress("")).toBe(false)
  })
})
