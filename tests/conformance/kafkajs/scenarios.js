// The Kafka client scenarios of pgstreams' conformance tests with KafkaJS: one line per scenario, the same
// as tests/conformance/scenarios.py prints for the other clients.
//   node scenarios.js BOOTSTRAP PREFIX
"use strict";
const { Kafka, CompressionTypes, logLevel } = require("kafkajs");

const [bootstrap, prefix] = process.argv.slice(2);
const kafka = new Kafka({ clientId: "conformance", brokers: [bootstrap], logLevel: logLevel.NOTHING,
                          retry: { retries: 2 } });
const KEYED = Array.from({ length: 12 }, (_, i) => [`k${i % 6}`, `v${i}`]);

// [partition, value] of the first `count` records of `topic` a new group reads (from `offset` of partition 0
// when given, else from the beginning), or of those that came within 30 s.
async function read(topic, count, offset) {
  const consumer = kafka.consumer({ groupId: `${prefix}kafkajs-${topic}`, maxWaitTimeInMs: 100,
                                    rebalanceTimeout: 2000, sessionTimeout: 6000, heartbeatInterval: 500 });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  if (offset !== undefined) {
    consumer.on(consumer.events.GROUP_JOIN, () => consumer.seek({ topic, partition: 0, offset: String(offset) }));
  }
  const got = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, 30000);
    consumer.run({
      eachMessage: async ({ partition, message }) => {
        got.push([partition, message.value.toString()]);
        if (got.length >= count) { clearTimeout(timer); resolve(); }
      },
    }).catch(reject);
  });
  await consumer.disconnect();
  return got;
}

function keyedLine(got) {
  const parts = new Map();
  for (const [p, v] of got) { if (!parts.has(p)) parts.set(p, []); parts.get(p).push(v); }
  return "keyed: " + [...parts.keys()].sort((a, b) => a - b).map((p) => `p${p}=${parts.get(p).join(",")}`).join(" ");
}

async function main() {
  const admin = kafka.admin();
  await admin.connect();
  const md = await admin.fetchTopicMetadata({ topics: [`${prefix}meta`] });
  console.log(`metadata: ${prefix}meta partitions=${md.topics[0].partitions.length}`);
  await admin.disconnect();
  const producer = kafka.producer({ allowAutoTopicCreation: false });
  await producer.connect();
  for (const [name, acks] of [["0", 0], ["1", 1], ["all", -1]]) {
    await producer.send({ topic: `${prefix}acks${name}`, acks,
                          messages: [0, 1, 2].map((i) => ({ key: `k${i}`, value: `v${i}` })) });
    const got = await read(`${prefix}acks${name}`, 3);
    console.log(`acks=${name}: ` + got.map(([, v]) => v).join(" "));
  }
  const admin2 = kafka.admin();
  await admin2.connect();
  await producer.send({ topic: `${prefix}latest`, messages: [{ value: "old0" }, { value: "old1" }] });
  const end = (await admin2.fetchTopicOffsets(`${prefix}latest`))[0].high;
  await producer.send({ topic: `${prefix}latest`, messages: [{ value: "new0" }] });
  console.log("from latest: " + (await read(`${prefix}latest`, 1, end)).map(([, v]) => v).join(" "));
  await producer.send({ topic: `${prefix}bytime`, messages: [{ value: "before0" }, { value: "before1" }] });
  const at = Date.now() + 1;
  await new Promise((r) => setTimeout(r, 10));  // the records after it are stamped later
  await producer.send({ topic: `${prefix}bytime`, messages: [{ value: "after0" }, { value: "after1" }] });
  const found = (await admin2.fetchTopicOffsetsByTimestamp(`${prefix}bytime`, at))[0].offset;
  console.log("from a time: " + (await read(`${prefix}bytime`, 2, found)).map(([, v]) => v).join(" "));
  await admin2.disconnect();
  for (const codec of ["gzip", "snappy", "lz4", "zstd"]) {
    // KafkaJS itself compresses with gzip only: the other codecs need packages of their own
    const type = { gzip: CompressionTypes.GZIP }[codec];
    if (type === undefined) {
      console.log(`compression=${codec}: unsupported by the client`);
      continue;
    }
    await producer.send({ topic: `${prefix}${codec}`, compression: type,
                          messages: [0, 1, 2].map((i) => ({ key: `k${i}`, value: `v${i}`.repeat(50) })) });
    const got = await read(`${prefix}${codec}`, 3);
    console.log(`compression=${codec}: ` + got.map(([, v]) => v.slice(0, 2)).join(" "));
  }
  for (const [key, value] of KEYED) {  // one at a time: the order within each partition is the order sent
    await producer.send({ topic: `${prefix}keyed`, messages: [{ key, value }] });
  }
  console.log(keyedLine(await read(`${prefix}keyed`, KEYED.length)));
  let unknown = "stored";
  try {
    await producer.send({ topic: `${prefix}missing`, messages: [{ value: "x" }], timeout: 5000 });
  } catch (e) {
    unknown = "error";
  }
  console.log(`unknown topic: ${unknown}`);
  await producer.disconnect();
}

main().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });
