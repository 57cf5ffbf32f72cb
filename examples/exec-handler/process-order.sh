#!/bin/sh
# An exec handler: the order on stdin, its metadata in HOLDFAST_* variables.
# Exit 0: done (acked). Exit 65: the order itself is bad (dead-lettered at
# once). Anything else: try again later.
order=$(cat)
case $order in
*'"sku"'*)
	echo "order $HOLDFAST_SEQ ($HOLDFAST_SUBJECT, delivery $HOLDFAST_DELIVERY) processed: $order" >&2
	exit 0
	;;
*)
	echo "order $HOLDFAST_SEQ has no sku: refused" >&2
	exit 65
	;;
esac
