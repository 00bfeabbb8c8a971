/**
 * Realistic worst-case inputs for text group A's largestInput: a mixed operations report (prose,
 * log lines, key: value lines, contacts, figures) of a given length. No side effects.
 */
export function largeReportA(chars: number): string {
  const blocks: string[] = [];
  let size = 0;
  for (let i = 0; size < chars; i++) {
    const b =
      `Incident ${i}: on March ${(i % 28) + 1}, 2026 the billing worker at 10.0.${i % 256}.${(i * 7) % 256} returned errors for ${(i % 90) + 10}% of requests.\n` +
      `Angela Merkel from Acme Corporation in Berlin emailed ops${i}@example.com and called +1 (415) 555-${String(1000 + (i % 9000)).padStart(4, '0')}.\n` +
      `2026-03-${String((i % 28) + 1).padStart(2, '0')}T10:${String(i % 60).padStart(2, '0')}:00Z ERROR queue timeout after 5000 ms in /srv/app/worker-${i % 8}.js\n` +
      `status: degraded\nowner: platform team\ncost: $${(i % 50) * 125 + 300}\n\n` +
      `The retry storm cleared after the ledger lock was released; see https://status.example.com/incidents/${i} for details.\n\n`;
    blocks.push(b);
    size += b.length;
  }
  return blocks.join('').slice(0, chars);
}
